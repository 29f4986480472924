// The `__metadata__` entries torch.distributed.checkpoint's HuggingFaceStorageWriter puts in
// each safetensors file it writes (docs/formats.md §9.10): DCP_SHARDING_INFO, a JSON text
// inside the string map, giving each tensor of the file the offsets of its box in the
// global tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ckpt::dcp {

inline constexpr const char* kShardingInfoKey = "DCP_SHARDING_INFO";
inline constexpr const char* kVersionKey = "DCP_VERSION";

struct sharding_info {
  /// fqn -> saved_offsets. As Python's json.loads, the last of two equal keys wins.
  std::unordered_map<std::string, std::vector<int64_t>> offsets;
};

/// Parses the DCP_SHARDING_INFO text: `{fqn: {"saved_offsets": [int, ...]}, ...}`. Members
/// other than saved_offsets are ignored, as HuggingFaceStorageReader ignores them. Throws a
/// corrupt ckpt::error (no file, no offset: the caller names the file) for text that is not
/// JSON of that form, or an offset that is negative or not an integer.
sharding_info parse_sharding_info(std::string_view text);

/// The value of `key` in a safetensors `__metadata__` map, if present.
std::optional<std::string_view> metadata_value(const std::vector<std::pair<std::string, std::string>>& metadata,
                                               std::string_view key);

}  // namespace ckpt::dcp
