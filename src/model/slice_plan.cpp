#include "model/slice_plan.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "ckpt/error.h"

namespace ckpt::detail {

void intersect_piece(const std::vector<dim_range>& slice, const std::vector<dim_range>& piece, uint64_t e,
                     uint64_t file_offset, std::vector<slice_span>& out) {
  const size_t n = slice.size();
  if (piece.size() != n) throw std::invalid_argument("intersect_piece: boxes of different ranks");
  std::vector<int64_t> lo(n), len(n);
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(slice[d].start, piece[d].start);
    const int64_t hi = std::min(slice[d].start + slice[d].length, piece[d].start + piece[d].length);
    if (hi <= lo[d]) return;  // nothing shared (an empty shard among them)
    len[d] = hi - lo[d];
  }
  // Byte strides of the piece and of the slice, both row-major.
  std::vector<uint64_t> ps(n, e), ss(n, e);
  for (size_t d = n; d-- > 1;) {
    ps[d - 1] = ps[d] * uint64_t(piece[d].length);
    ss[d - 1] = ss[d] * uint64_t(slice[d].length);
  }
  // The run: from `cut`, the outermost dimension whose inner ones are all spanned whole in
  // both boxes (so they are contiguous in both), taken over its shared length.
  size_t cut = 0;
  for (size_t d = n; d-- > 0;)
    if (len[d] != piece[d].length || len[d] != slice[d].length) {
      cut = d;
      break;
    }
  uint64_t width = e;
  if (n) width = uint64_t(len[cut]) * ps[cut];
  // The outer dimensions that step (more than one element): the innermost of them is the
  // span's rows, the others enumerate spans.
  std::vector<size_t> steps;
  for (size_t d = 0; d < cut; ++d)
    if (len[d] > 1) steps.push_back(d);
  uint64_t src0 = file_offset, dst0 = 0;
  for (size_t d = 0; d < n; ++d) {
    src0 += uint64_t(lo[d] - piece[d].start) * ps[d];
    dst0 += uint64_t(lo[d] - slice[d].start) * ss[d];
  }
  if (steps.empty()) {
    out.push_back({src0, dst0, width, 1, 0, 0});
    return;
  }
  const size_t row_dim = steps.back();
  steps.pop_back();
  std::vector<int64_t> digit(steps.size(), 0);
  while (true) {
    uint64_t src = src0, dst = dst0;
    for (size_t k = 0; k < steps.size(); ++k) {
      src += uint64_t(digit[k]) * ps[steps[k]];
      dst += uint64_t(digit[k]) * ss[steps[k]];
    }
    out.push_back({src, dst, width, uint64_t(len[row_dim]), ps[row_dim], ss[row_dim]});
    size_t k = steps.size();
    while (k > 0 && ++digit[k - 1] == len[steps[k - 1]]) digit[--k] = 0;
    if (k == 0) break;
  }
}

uint64_t span_bytes(const std::vector<slice_span>& spans) {
  uint64_t n = 0;
  for (const slice_span& s : spans) n += s.width * s.rows;
  return n;
}

std::vector<slice_read> plan_slice_reads(const std::vector<slice_span>& spans, const slice_read_options& o) {
  std::vector<slice_read> out;
  const uint64_t max_read = std::max<uint64_t>(o.max_read, 1);
  for (size_t i = 0; i < spans.size(); ++i) {
    const slice_span& s = spans[i];
    if (!s.width || !s.rows) continue;
    const bool file_contiguous = s.rows == 1 || s.src_pitch == s.width;
    const bool slice_contiguous = s.rows == 1 || s.dst_pitch == s.width;
    if (file_contiguous && slice_contiguous) {
      // One range in both: straight into the slice, cut at max_read.
      const uint64_t total = s.width * s.rows;
      for (uint64_t at = 0; at < total; at += max_read)
        out.push_back({i, 0, s.rows, s.src + at, std::min(max_read, total - at), slice_read::mode::direct});
      continue;
    }
    const uint64_t gap = s.src_pitch - s.width;  // src_pitch >= width: rows never overlap
    const bool close = s.src_pitch >= s.width && gap * std::max<uint64_t>(o.gap_ratio, 1) <= s.width;
    if (!close || s.width > max_read) {
      // Far apart (a column slice of a wide matrix): each row on its own, straight into
      // its place. Rows are grouped only to bound the work of one read item.
      const uint64_t per = std::max<uint64_t>(1, max_read / s.width);
      for (uint64_t r = 0; r < s.rows; r += per) {
        const uint64_t k = std::min(per, s.rows - r);
        out.push_back({i, r, k, s.src + r * s.src_pitch, k * s.width, slice_read::mode::rows});
      }
      continue;
    }
    // Close rows: one read of several rows and the bytes between, copied row by row.
    const uint64_t per = std::max<uint64_t>(1, (max_read - s.width) / s.src_pitch + 1);
    for (uint64_t r = 0; r < s.rows; r += per) {
      const uint64_t k = std::min(per, s.rows - r);
      out.push_back({i, r, k, s.src + r * s.src_pitch, (k - 1) * s.src_pitch + s.width, slice_read::mode::bounce});
    }
  }
  return out;
}

uint64_t read_spans(const byte_source& file, const std::vector<slice_span>& spans, uint8_t* dst,
                    const slice_read_options& o) {
  std::unique_ptr<uint8_t[]> bounce;
  uint64_t total = 0;
  try {
    for (const slice_read& r : plan_slice_reads(spans, o)) {
      const slice_span& s = spans[r.span];
      switch (r.how) {
        case slice_read::mode::direct:
          file.read_exact(r.offset, dst + s.dst + (r.offset - s.src), size_t(r.nbytes));
          break;
        case slice_read::mode::rows:
          for (uint64_t k = r.first_row; k < r.first_row + r.row_count; ++k)
            file.read_exact(s.src + k * s.src_pitch, dst + s.dst + k * s.dst_pitch, size_t(s.width));
          break;
        case slice_read::mode::bounce:
          if (!bounce) bounce.reset(new uint8_t[std::max<uint64_t>(o.max_read, 1)]);
          file.read_exact(r.offset, bounce.get(), size_t(r.nbytes));
          for (uint64_t k = 0; k < r.row_count; ++k)
            std::memcpy(dst + s.dst + (r.first_row + k) * s.dst_pitch, bounce.get() + k * s.src_pitch, size_t(s.width));
          break;
      }
      total += r.nbytes;
    }
  } catch (error& e) {
    file.locate(e);
    throw;
  }
  return total;
}

}  // namespace ckpt::detail
