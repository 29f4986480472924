// The state dict as data: every key with the tensor (or, later, the pieces of a tensor
// assembled from chunks) it names. Each reader fills it once, from what the file says a
// state dict is (a dict in the pickle, a pickled module's _parameters, a safetensors
// header); inspect, verify, rekey --match, materialize and the library read it instead of
// re-deriving names from pickle nodes, and it survives release_pickle.
//
// Sized for a million keys: the keys' text lies in one arena, and a key of one piece (every
// key of every format ckptool reads today) costs 8 bytes besides its text: its dtype and
// global shape are its tensor record's, not copied. Hence the bounds: 4 GiB of key text and
// 2^31 tensor records, far past what open_options' limits let a file declare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dim_list.h"
#include "ckpt/dtype.h"

namespace ckpt {

struct tensor_record;

/// Part of a named tensor: checkpoint::tensors[tensor] holds the block of the global tensor
/// that starts at `offsets` (one per dimension; empty means all zero, the one-piece case).
struct tensor_piece {
  size_t tensor = 0;
  std::vector<int64_t> offsets;
};

class key_table {
 public:
  /// Room for `keys` keys of `text_bytes` bytes in all (avoids regrowth; optional).
  void reserve(size_t keys, size_t text_bytes);
  /// A key held whole by one tensor record. Several keys may name one record (tied weights).
  /// Throws errc::limit past the table's bounds (above).
  void add(std::string_view key, size_t tensor);
  /// A key assembled from several records: its dtype and global shape are its own.
  void add(std::string_view key, dtype type, std::vector<int64_t> global_shape, std::vector<tensor_piece> pieces);
  /// Returns the spare capacity the filling left (called once a reader is done).
  void shrink_to_fit();
  void clear();

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::string_view key(size_t i) const;
  size_t piece_count(size_t i) const;
  /// Piece p of key i (for a one-piece key: {tensor, {}}).
  tensor_piece piece(size_t i, size_t p) const;
  /// The tensor record that holds key i whole. Throws errc::unsupported, naming the key,
  /// when it is assembled from several pieces: a caller that reads one record per key
  /// must refuse such a key rather than read a part of it as the whole.
  size_t tensor(size_t i) const;
  /// Key i's dtype and global shape, from its record when it has one piece.
  dtype type(size_t i, const std::vector<tensor_record>& tensors) const;
  const dim_list& shape(size_t i, const std::vector<tensor_record>& tensors) const;

  /// Heap bytes held (capacity, not size): what the table costs.
  size_t memory_bytes() const;

 private:
  // A key's text is text_[previous end, end); `target` is its tensor record, or, with
  // kAssembled set, an index into assembled_.
  struct entry {
    uint32_t end;
    uint32_t target;
  };
  static constexpr uint32_t kAssembled = uint32_t(1) << 31;
  void push(std::string_view key, uint64_t target);
  struct assembled {
    dtype type;
    dim_list shape;
    std::vector<tensor_piece> pieces;
  };
  std::string text_;
  std::vector<entry> entries_;
  std::vector<assembled> assembled_;
};

}  // namespace ckpt
