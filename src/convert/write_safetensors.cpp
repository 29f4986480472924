// convert --to safetensors and --to hf (formats.md §13.2): files written by the safetensors
// writer (§6.1), each tensor copied straight from the input where it is one range of it.
#include "convert/convert_writers.h"

#include "ckpt/error.h"
#include "convert/tensor_bytes.h"
#include "formats/safetensors_writer.h"

namespace ckpt::detail {

uint64_t write_safetensors_file(const checkpoint& c, const convert_plan& plan, const std::vector<size_t>& indices,
                                const std::optional<metadata_pairs>& metadata, output_file& out,
                                const convert_request& request, const std::function<void(uint64_t)>& on_data) {
  std::vector<safetensors::tensor_spec> specs;
  specs.reserve(indices.size());
  for (size_t i : indices) {
    const convert_tensor& t = plan.tensors[i];
    specs.push_back({t.name, t.type, t.shape, t.nbytes});
  }
  safetensors::file_layout layout;
  try {
    layout = safetensors::plan(specs, metadata);
  } catch (error& e) {
    e.with_file(c.path);  // a name or dtype of the input the format cannot hold
    throw;
  }
  const tensor_bytes source(c, plan, request);
  uint64_t done = 0;
  safetensors::write(out, layout, specs, [&](size_t k, safetensors::tensor_sink& sink) {
    const convert_tensor& t = plan.tensors[indices[k]];
    if (auto range = source.straight_range(t)) {
      sink.copy(range->fd, *range->name, range->offset, range->nbytes);
    } else if (auto pieces = source.straight_pieces(t)) {
      for (const file_range& p : *pieces) sink.copy(p.fd, *p.name, p.offset, p.nbytes);
    } else {
      const tensor_buffer b = source.gather(t);
      sink.write(b.bytes.get(), size_t(b.nbytes));
    }
    done += t.nbytes;
    if (on_data) on_data(done);
  });
  return layout.file_size();
}

}  // namespace ckpt::detail
