#include "ckpt/key_table.h"

#include <stdexcept>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"

namespace ckpt {

void key_table::reserve(size_t keys, size_t text_bytes) {
  entries_.reserve(keys);
  text_.reserve(text_bytes);
}

void key_table::push(std::string_view key, uint64_t target) {
  if (text_.size() + key.size() > UINT32_MAX) throw_limit("the state dict's keys exceed 4 GiB of text");
  text_.append(key);
  entries_.push_back({uint32_t(text_.size()), uint32_t(target)});
}

void key_table::add(std::string_view key, size_t tensor) {
  if (tensor >= kAssembled) throw_limit("more than 2^31 tensor records");
  push(key, tensor);
}

void key_table::add(std::string_view key, dtype type, std::vector<int64_t> global_shape,
                    std::vector<tensor_piece> pieces) {
  if (pieces.empty()) throw std::invalid_argument("key_table::add: a key needs at least one piece");
  for (const auto& p : pieces)
    if (!p.offsets.empty() && p.offsets.size() != global_shape.size())
      throw std::invalid_argument("key_table::add: a piece's offsets need one value per dimension");
  if (assembled_.size() >= kAssembled) throw_limit("more than 2^31 assembled keys");
  push(key, kAssembled | uint64_t(assembled_.size()));
  assembled_.push_back({type, std::move(global_shape), std::move(pieces)});
}

void key_table::shrink_to_fit() {
  text_.shrink_to_fit();
  entries_.shrink_to_fit();
  assembled_.shrink_to_fit();
}

void key_table::clear() {
  *this = key_table();
}

std::string_view key_table::key(size_t i) const {
  const uint32_t begin = i ? entries_.at(i - 1).end : 0;
  return std::string_view(text_).substr(size_t(begin), size_t(entries_.at(i).end - begin));
}

size_t key_table::piece_count(size_t i) const {
  const uint32_t t = entries_.at(i).target;
  return t & kAssembled ? assembled_[size_t(t & ~kAssembled)].pieces.size() : 1;
}

tensor_piece key_table::piece(size_t i, size_t p) const {
  const uint32_t t = entries_.at(i).target;
  if (t & kAssembled) return assembled_[size_t(t & ~kAssembled)].pieces.at(p);
  if (p != 0) throw std::out_of_range("key_table::piece: a one-piece key");
  return {size_t(t), {}};
}

size_t key_table::tensor(size_t i) const {
  const uint32_t t = entries_.at(i).target;
  if (t & kAssembled)
    throw_unsupported("key '" + std::string(key(i)) + "' is assembled from " +
                      std::to_string(assembled_[size_t(t & ~kAssembled)].pieces.size()) +
                      " pieces, which this operation does not read yet");
  return size_t(t);
}

dtype key_table::type(size_t i, const std::vector<tensor_record>& tensors) const {
  const uint32_t t = entries_.at(i).target;
  return t & kAssembled ? assembled_[size_t(t & ~kAssembled)].type : tensors.at(size_t(t)).type;
}

const dim_list& key_table::shape(size_t i, const std::vector<tensor_record>& tensors) const {
  const uint32_t t = entries_.at(i).target;
  return t & kAssembled ? assembled_[size_t(t & ~kAssembled)].shape : tensors.at(size_t(t)).shape;
}

size_t key_table::memory_bytes() const {
  size_t n = text_.capacity() + entries_.capacity() * sizeof(entry) + assembled_.capacity() * sizeof(assembled);
  for (const auto& a : assembled_) {
    n += a.shape.capacity() * sizeof(int64_t) + a.pieces.capacity() * sizeof(tensor_piece);
    for (const auto& p : a.pieces) n += p.offsets.capacity() * sizeof(int64_t);
  }
  return n;
}

}  // namespace ckpt
