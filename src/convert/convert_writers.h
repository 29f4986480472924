// Internal: the writers behind write_converted_file and write_converted_hf_set
// (ckpt/convert.h). Each writes the plan's tensors in its format into one output file (cast
// with `request`'s cast function where the plan casts) and reports the tensor bytes written
// so far through `on_data`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/convert.h"

namespace ckpt::detail {

using metadata_pairs = std::vector<std::pair<std::string, std::string>>;

/// One torch.save zip of every tensor of the plan. Returns the file's size.
uint64_t write_torch_file(const checkpoint& c, const convert_plan& plan, output_file& out,
                          const convert_request& request, const std::function<void(uint64_t)>& on_data);

/// One safetensors file of the plan's tensors at `indices` (ties excluded by the caller),
/// with `metadata` as its `__metadata__` (nullopt: none). Returns the file's size.
uint64_t write_safetensors_file(const checkpoint& c, const convert_plan& plan, const std::vector<size_t>& indices,
                                const std::optional<metadata_pairs>& metadata, output_file& out,
                                const convert_request& request, const std::function<void(uint64_t)>& on_data);

}  // namespace ckpt::detail
