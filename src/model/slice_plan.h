// Internal: which file bytes make up a slice of a tensor (docs/formats.md §16.3). A tensor
// is held by pieces, each a box of the tensor stored row-major from a file offset (one
// piece for a tensor held whole: a single file or a shard set; several for DCP chunks).
// The slice, a box as well, meets each piece in a box whose elements are runs contiguous
// in both the piece and the slice: the innermost dimensions the intersection spans whole
// in both, plus the first one it does not. A dim-0 slice of a whole tensor is one run;
// a dim-1 slice of a matrix is one run per row, `rows` runs of `width` bytes a pitch apart.
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/slice.h"

namespace ckpt::detail {

/// `rows` runs of `width` bytes: file bytes [src + r * src_pitch, + width) land at
/// dst + r * dst_pitch in the slice (row-major, its first element at 0).
struct slice_span {
  uint64_t src = 0, dst = 0, width = 0, rows = 1, src_pitch = 0, dst_pitch = 0;
  bool operator==(const slice_span& o) const {
    return src == o.src && dst == o.dst && width == o.width && rows == o.rows && src_pitch == o.src_pitch &&
           dst_pitch == o.dst_pitch;
  }
};

/// Appends the spans that land the elements `piece` (stored row-major from file offset
/// `file_offset`) shares with `slice`, both boxes of one tensor, in piece order. Nothing
/// for an empty intersection; a 0-dim tensor (empty boxes) is one element.
void intersect_piece(const std::vector<dim_range>& slice, const std::vector<dim_range>& piece, uint64_t element_bytes,
                     uint64_t file_offset, std::vector<slice_span>& out);

/// Bytes a slice's spans land (what the slice holds once every piece is met).
uint64_t span_bytes(const std::vector<slice_span>& spans);

/// One read of a span's rows: file [offset, offset + nbytes) holding rows [first_row,
/// first_row + row_count); `bounce`: read into a buffer and copied row by row (rows close
/// in the file), else read straight to the slice (contiguous in both) or row by row.
struct slice_read {
  size_t span = 0;
  uint64_t first_row = 0, row_count = 0;
  uint64_t offset = 0, nbytes = 0;
  enum class mode { direct, rows, bounce } how = mode::direct;
};

struct slice_read_options {
  /// No read is longer (the bounce buffer's size).
  uint64_t max_read = 16ull << 20;
  /// Rows share a read when the bytes between them are at most width / gap_ratio: the
  /// bytes read stay within 1 / gap_ratio of the slice's.
  uint64_t gap_ratio = 32;
};

/// How to read `spans`: coalesced where the rows are close, cut at max_read.
std::vector<slice_read> plan_slice_reads(const std::vector<slice_span>& spans, const slice_read_options& o = {});

/// Reads `spans` of `file` into `dst` (the slice, row-major from its first element) as
/// plan_slice_reads plans them, one read after the other, through a buffer of at most
/// o.max_read bytes. Returns the bytes read. Throws what the source throws, located.
uint64_t read_spans(const byte_source& file, const std::vector<slice_span>& spans, uint8_t* dst,
                    const slice_read_options& o = {});

}  // namespace ckpt::detail
