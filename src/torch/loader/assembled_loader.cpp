#include "torch/loader/assembled_loader.h"

#include <optional>
#include <string>

#include "ckpt/error.h"
#include "model/assembly.h"
#include "model/read_plan.h"
#include "torch/aten_types.h"
#include "torch/loader/host_buffer.h"
#include "torch/loader/storage_loader.h"

namespace ckpt::detail {
namespace {

// A CPU tensor of a megabyte and more is allocated as the single-file loader allocates such
// a storage (host_buffer.h): fresh pages of its own, which piece_reader faults in a read at
// a time rather than a page at a time inside the read. Its first byte is placed congruent
// with the file for its largest contiguous piece, so that piece's pages are copied page to
// page; the other pieces of a tensor generally cannot be congruent as well.
at::Tensor empty_cpu_tensor(const checkpoint& c, const assembly& a, const assembled_tensor& t, c10::ScalarType st) {
  if (t.nbytes < kOwnMappingBytes) return at::empty(t.shape, at::TensorOptions().dtype(st));
  uint64_t phase = 0, largest = 0;
  for (size_t s : t.storages) {
    const box_landing& l = *a.landing(s);
    if (!l.contiguous() || l.nbytes <= largest) continue;
    largest = l.nbytes;
    const storage_record& r = c.storages[s];
    const uint64_t in_file = c.files[r.file].source->in_file().offset + *r.file_offset;
    phase = (in_file + kPageBytes - l.offset % kPageBytes) % kPageBytes;
  }
  return allocate_host_tensor(t.shape, st, phase);
}

}  // namespace

loaded_tensors load_with_pieces(const checkpoint& c, std::vector<bool> needed, const std::vector<size_t>& viewed,
                                const std::vector<size_t>& assembled_keys, const load_options& o) {
  loaded_tensors out;
  const assembly a = plan_assembly(c, assembled_keys);
  if (a.tensors.empty()) {
    out.storages = load_storages(c, needed, o);
    return out;
  }
  check_device(o.device);  // before the first allocation on it
  auto key_name = [&](const assembled_tensor& t) { return "key '" + std::string(c.keys.key(t.key)) + "'"; };
  // A storage lands in one place: a piece's storage that another tensor views as well
  // would need a second copy of its bytes.
  const std::vector<bool> views = storages_of(c, viewed);
  for (const assembled_tensor& t : a.tensors)
    for (size_t s : t.storages) {
      if (views[s])
        throw_unsupported(key_name(t) + ": a piece's storage (" + c.storages[s].key +
                          ") is also read as another tensor's data");
      needed[s] = false;
    }

  const c10::Device place = o.device.is_meta() ? c10::Device(c10::kMeta) : o.device;
  piece_targets targets;
  std::vector<at::Tensor> whole(a.tensors.size());
  std::vector<std::optional<size_t>> mapped(a.tensors.size());  // --mmap: the storage that is the tensor
  for (size_t j = 0; j < a.tensors.size(); ++j) {
    const assembled_tensor& t = a.tensors[j];
    const c10::ScalarType st = scalar_type(t.type);
    if (c10::isQIntType(st)) throw_unsupported(key_name(t) + ": quantized pieces are not assembled");
    out.piece_bytes += t.nbytes;
    if (o.device.is_meta() || t.nbytes == 0) {  // nothing to read
      whole[j] = at::empty(t.shape, at::TensorOptions().dtype(st).device(place));
      continue;
    }
    if (o.mmap) {
      // A mapping shows file bytes in file order: only a piece that is the whole tensor.
      const box_landing* l = t.storages.size() == 1 ? a.landing(t.storages[0]) : nullptr;
      if (!l || !l->contiguous() || l->offset != 0 || l->nbytes != t.nbytes)
        throw_unsupported(key_name(t) + " is assembled from " + std::to_string(c.keys.piece_count(t.key)) +
                          " pieces, which no mapping of the file shows as one tensor; load it without --mmap");
      needed[t.storages[0]] = true;
      mapped[j] = t.storages[0];
      continue;
    }
    // Empty, never initialized: every element is written by exactly one piece (plan_assembly).
    whole[j] = o.device.is_cpu() ? empty_cpu_tensor(c, a, t, st)
                                 : at::empty(t.shape, at::TensorOptions().dtype(st).device(o.device));
    if (targets.empty()) {
      targets.base.assign(c.storages.size(), nullptr);
      targets.boxes.assign(c.storages.size(), nullptr);
      targets.fresh_bytes.assign(c.storages.size(), 0);
    }
    const bool fresh = o.device.is_cpu() && t.nbytes >= kOwnMappingBytes;  // empty_cpu_tensor's own mapping
    for (size_t s : t.storages) {
      targets.base[s] = static_cast<uint8_t*>(whole[j].data_ptr());
      targets.boxes[s] = a.landing(s);
      targets.fresh_bytes[s] = fresh ? t.nbytes : 0;
    }
  }
  out.storages = load_storages(c, needed, o, &targets);
  for (size_t j = 0; j < a.tensors.size(); ++j) {
    const assembled_tensor& t = a.tensors[j];
    if (mapped[j]) whole[j] = out.storages[*mapped[j]].view(scalar_type(t.type)).view(t.shape);
    out.assembled.emplace(t.key, whole[j]);
  }
  return out;
}

}  // namespace ckpt::detail
