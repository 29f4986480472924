// Internal: the fast path of safetensors::read_header (docs/formats.md §6.2). A scanner for
// the headers writers produce (printable-ASCII strings without escapes, integers without
// signs, fractions or exponents) that returns false at anything else, so that the full
// JSON parser decides that header with its exact checks and messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace ckpt::safetensors {
struct limits;
}

namespace ckpt::safetensors::detail {

/// A tensor as the JSON states it, before any arithmetic.
struct raw_tensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t offsets[2] = {0, 0};
  unsigned offset_count = 0;
  unsigned seen = 0;  // bit per field
};

struct scan_limits {
  uint64_t max_tensors;
  uint64_t max_name_length;
  uint64_t max_rank;
};

/// Fills `tensors` and `metadata` in JSON order and returns true when `text` is a header
/// this scanner reads exactly: a JSON object of tensor objects with exactly the fields
/// dtype, shape and data_offsets (two values), and an optional "__metadata__" object of
/// strings; no duplicate key at any level; within `lim`. Returns false otherwise (the
/// outputs are then left in any state): not an error, only "not the common case".
bool scan_header(std::string_view text, const scan_limits& lim, std::vector<raw_tensor>& tensors,
                 std::vector<std::pair<std::string, std::string>>& metadata);

/// The full parser (nlohmann's SAX with the schema checks) that read_header falls back
/// to: same outputs, or ckpt::error (corrupt / limit) at the first problem. Offsets in
/// its errors count the 8-byte length prefix. Exposed for the differential tests.
void parse_header_json(std::string_view text, const limits& lim, std::vector<raw_tensor>& tensors,
                       std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace ckpt::safetensors::detail
