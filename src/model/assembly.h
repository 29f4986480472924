// Internal: where the pieces of assembled keys (key_table.h: a DCP tensor written as boxes
// by several ranks) land in their global tensors. Checked once here, before anything is
// allocated or read, so that every executor (the CPU loader, the CUDA staging pipeline)
// only moves bytes: a piece of the wrong dtype, a box outside the tensor, or boxes that
// overlap or leave elements unwritten are refused here, never returned as values.
//
// A piece's bytes are its box in row-major order. In the row-major global tensor they are
// runs: the innermost dimensions the box spans whole, plus the first one it does not,
// are contiguous in both; the box's outer dimensions step between runs. A dim-0 shard is
// one run (read straight into the tensor); a dim-1 shard is one run per row.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"

namespace ckpt::detail {

/// Where a piece's bytes go in its key's global tensor.
struct box_landing {
  uint64_t offset = 0;     // bytes from the tensor's first byte to the box's first element
  uint64_t nbytes = 0;     // the piece's bytes
  uint64_t run_bytes = 0;  // bytes contiguous in both the piece and the tensor
  // The box's outer dimensions of more than one element, outermost first: run r, written
  // in mixed radix over counts, lands at offset + sum(digit_k * pitches[k]). Empty: the
  // piece is one contiguous range of the tensor.
  std::vector<uint64_t> counts, pitches;
  bool contiguous() const { return counts.empty(); }
};

/// `rows` rows of `width` bytes, consecutive in the piece from piece_offset, landing
/// `pitch` bytes apart from dst_offset in the tensor (what cudaMemcpy2D copies).
struct box_span {
  uint64_t piece_offset, dst_offset, width, rows, pitch;
};

/// Calls f(box_span) for the spans that land piece bytes [from, from + n), in piece order.
/// A range cut anywhere (a read boundary) is served: partial runs become rows of one.
template <class F>
void for_each_span(const box_landing& b, uint64_t from, uint64_t n, F&& f) {
  if (b.contiguous()) {
    if (n) f(box_span{from, b.offset + from, n, 1, 0});
    return;
  }
  const uint64_t end = from + n;
  const size_t inner = b.counts.size() - 1;
  while (from < end) {
    const uint64_t run = from / b.run_bytes, within = from % b.run_bytes;
    uint64_t dst = b.offset, rest = run, inner_digit = 0;
    for (size_t k = b.counts.size(); k-- > 0;) {
      const uint64_t digit = rest % b.counts[k];
      rest /= b.counts[k];
      dst += digit * b.pitches[k];
      if (k == inner) inner_digit = digit;
    }
    if (within || end - from < b.run_bytes) {
      const uint64_t width = std::min(b.run_bytes - within, end - from);
      f(box_span{from, dst + within, width, 1, 0});
      from += width;
      continue;
    }
    // Whole runs up to the end of the innermost outer dimension share one pitch.
    const uint64_t rows = std::min((end - from) / b.run_bytes, b.counts[inner] - inner_digit);
    f(box_span{from, dst, b.run_bytes, rows, b.pitches[inner]});
    from += rows * b.run_bytes;
  }
}

/// Whether key k has pieces of its own (key_table::add with a dtype, a shape and pieces)
/// rather than one record holding it whole. A key of several pieces, or of one at an
/// offset, is; a key of one piece at no offset (a 0-dim tensor's) says so by refusing
/// tensor(k), which throws only then.
inline bool is_assembled(const key_table& keys, size_t k) {
  if (keys.piece_count(k) != 1 || !keys.piece(k, 0).offsets.empty()) return true;
  try {
    keys.tensor(k);
    return false;
  } catch (const error&) {
    return true;
  }
}

/// One assembled key to materialize.
struct assembled_tensor {
  size_t key = 0;  // index into checkpoint::keys
  dtype type = dtype::float32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::vector<size_t> storages;  // its pieces' storages, each with a landing (empty pieces left out)
};

struct assembly {
  std::vector<assembled_tensor> tensors;
  std::vector<box_landing> landings;
  /// By storage (sized only when some key is assembled): 1 + the index of its landing in
  /// `landings`, 0 for a storage that is no piece.
  std::vector<uint32_t> landing_of_storage;
  /// By storage: the assembled_tensor a piece storage belongs to.
  std::vector<uint32_t> tensor_of_storage;

  const box_landing* landing(size_t storage) const {
    if (storage >= landing_of_storage.size() || !landing_of_storage[storage]) return nullptr;
    return &landings[landing_of_storage[storage] - 1];
  }
};

/// Checks and lays out the assembled keys among `keys` (indices into c.keys; one-piece
/// keys are skipped). Throws errc::corrupt for a piece whose dtype differs from its key's,
/// whose box lies outside the global shape or overlaps another, or pieces that leave
/// elements of the tensor unwritten; errc::unsupported for a piece the executors cannot
/// land exactly (not a plain contiguous tensor whose storage holds exactly its bytes, a
/// storage shared by two pieces). With `allow_unopened`, a piece whose DCP chunk archive was
/// not opened (storage_record::archive_range) passes on its box alone: for a reader that
/// meets boxes before it reads (load_tensors with a selection) and refuses such a piece
/// where it needs its bytes.
assembly plan_assembly(const checkpoint& c, const std::vector<size_t>& keys, bool allow_unopened = false);

}  // namespace ckpt::detail
