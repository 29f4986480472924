// safetensors: u64 LE header length N | N bytes of UTF-8 JSON | data buffer.
// The JSON maps names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data buffer) plus an optional "__metadata__" string->string map. Validation
// follows the reference implementation (safetensors/src/tensor.rs; formats.md §6,
// security.md S1-S8): N <= 100,000,000; no duplicate keys; known dtypes; checked
// shape x bitsize arithmetic; entries sorted by offset cover the buffer exactly, with no
// gap, no overlap, and nothing after the last one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/dtype.h"

namespace ckpt::safetensors {

constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct tensor_entry {
  std::string name;
  dtype type;
  /// torch's shape. For F4 (4-bit, packed two per byte) the type is float4_e2m1fn_x2 and the
  /// last dimension is half the header's, as safetensors' torch binding loads it; an odd last
  /// dimension is errc::unsupported. F6_E2M3/F6_E3M2 (no torch dtype) are errc::unsupported.
  std::vector<int64_t> shape;
  uint64_t begin = 0;        // relative to the data buffer
  uint64_t end = 0;
  uint64_t file_offset = 0;  // absolute: 8 + N + begin
};

struct header {
  uint64_t header_size = 0;                   // N
  uint64_t data_start = 0;                    // 8 + N
  std::vector<tensor_entry> tensors;          // in the order the JSON lists them
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", in order
};

struct limits {
  uint64_t max_tensors = 1'000'000;
  uint64_t max_name_length = 64 * 1024;
  uint64_t max_rank = 64;
};

/// True when the first bytes can start a safetensors file (8-byte length, then '{' or
/// JSON whitespace). Cheap; used by format detection before the full parse.
bool looks_like_safetensors(const uint8_t* first, size_t n, uint64_t file_size);

/// Reads and validates the header of `src` (reads 8 + N bytes, never the data). Throws
/// ckpt::error (corrupt / unsupported / limit) naming the byte offset of the problem.
header read_header(const byte_source& src, const limits& lim = {});

}  // namespace ckpt::safetensors
