// convert --to torch: a torch.save archive in the layout torch.save writes (formats.md
// §2.2, §13.3): data.pkl is an OrderedDict of _rebuild_tensor_v2 calls (v3 with an
// UntypedStorage for dtypes without a typed storage class), one contiguous storage per
// tensor, numbered in key order; a tie is the same pickled object under both keys, as
// torch.save writes one tensor object met twice.
#include "convert/convert_writers.h"

#include "ckpt/error.h"
#include "ckpt/pickle_writer.h"
#include "ckpt/zip_writer.h"
#include "convert/tensor_bytes.h"
#include "pickle/pickle_builder.h"

namespace ckpt::detail {
namespace {

std::vector<uint8_t> state_dict_pickle(const convert_plan& plan, std::vector<size_t>& storage_of) {
  pickle::builder b;
  pickle::value* root = b.ordered_dict();
  b.doc.root = root;
  std::vector<pickle::value*> node(plan.tensors.size(), nullptr);
  size_t storages = 0;
  storage_of.assign(plan.tensors.size(), 0);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const convert_tensor& t = plan.tensors[i];
    if (t.tie_of) {
      node[i] = node[*t.tie_of];
    } else {
      const dtype_info& di = info(t.type);
      const bool typed = di.legacy_storage != nullptr;
      storage_of[i] = storages++;
      const uint64_t count = typed ? t.nbytes / di.element_size : t.nbytes;
      pickle::value* pid = b.doc.make(pickle::kind::persistent_id, 0);
      pid->items = {b.tuple({b.str("storage"),
                             typed ? b.global("torch", di.legacy_storage) : b.global("torch.storage", "UntypedStorage"),
                             b.str(std::to_string(storage_of[i])), b.str("cpu"), b.integer(int64_t(count))})};
      std::vector<pickle::value*> args = {pid, b.integer(0), b.ints(t.shape), b.ints(contiguous_strides(t.shape)),
                                          b.boolean(false), b.ordered_dict()};
      if (!typed) args.push_back(b.global("torch", di.name));
      node[i] = b.call(b.global("torch._utils", typed ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3"), b.tuple(args));
    }
    root->items.push_back(b.str(t.name));
    root->items.push_back(node[i]);
  }
  return pickle::write(b.doc.root, 2, &b.doc);
}

}  // namespace

uint64_t write_torch_file(const checkpoint& c, const convert_plan& plan, output_file& out,
                          const convert_request& request, const std::function<void(uint64_t)>& on_data) {
  std::vector<size_t> storage_of;
  const std::vector<uint8_t> pkl = state_dict_pickle(plan, storage_of);
  const tensor_bytes source(c, plan, request);
  zip::writer w(out.fd(), "archive");
  w.reserve(plan.tensors.size() + 5);
  w.on_bytes_out([&out](uint64_t n) { out.start_writeback(n); });
  w.add_record("data.pkl", pkl);
  w.add_record(".format_version", "1", 1);
  w.add_record(".storage_alignment", "64", 2);
  w.add_record("byteorder", "little", 6);
  uint64_t done = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const convert_tensor& t = plan.tensors[i];
    if (t.tie_of) continue;
    const std::string record = "data/" + std::to_string(storage_of[i]);
    if (auto range = source.straight_range(t)) {
      w.add_record_copy(record, range->fd, range->offset, range->nbytes, range->crc32);
    } else {
      const tensor_buffer b = source.gather(t);
      w.add_record(record, b.bytes.get(), size_t(b.nbytes));
    }
    done += t.nbytes;
    if (on_data) on_data(done);
  }
  w.add_record("version", "3\n", 2);
  w.finish();
  return w.offset();
}

}  // namespace ckpt::detail
