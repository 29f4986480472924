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

/// The files of write_converted_hf_set's set (hf_set_files' order, the index last when
/// there is one): each file's tensor bytes (the index counts 0).
std::vector<uint64_t> hf_set_file_bytes(const convert_plan& plan, uint64_t max_shard_size);

/// write_converted_hf_set's files into `directory`: only those whose position in
/// hf_set_files' list `mine` marks (empty: all), so that several processes can write one
/// set. Each file is byte for byte what the whole set's writer gives it.
convert_result write_hf_set_files(const checkpoint& c, const convert_plan& plan, const std::string& directory,
                                  const std::vector<bool>& mine, const convert_request& request);

}  // namespace ckpt::detail
