// The element list of a pickle node: a vector of node pointers in 16 bytes (std::vector
// takes 24), grown with realloc so that a large list grows in place instead of being copied
// (no transient second copy: the memory bound of the pickle machine counts on it).
// A list may also borrow its elements from the document's arena (tuples and call records,
// which the machine builds once at their final size): no allocation of its own, and none
// to free. Growing a borrowed list moves it to storage of its own.
//
// Its 16 bytes are shared with the node's text (pickle_node_text.h): a node that holds text
// reads as having no elements.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <vector>

#include "ckpt/pickle_node_text.h"

namespace ckpt::pickle {

struct value;

class item_list {
 public:
  using value_type = value*;
  using iterator = value**;
  using const_iterator = value* const*;
  using size_type = size_t;

  item_list() = default;
  item_list(std::initializer_list<value*> init) { assign(init.begin(), init.end()); }
  item_list(const item_list& o) { assign(o.begin(), o.end()); }
  item_list(item_list&& o) noexcept : data_(o.data_), size_(o.size_), meta_(o.meta_) {
    o.data_ = nullptr;
    o.size_ = o.meta_ = 0;
  }
  item_list& operator=(const item_list& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  item_list& operator=(item_list&& o) noexcept {
    if (this != &o) {
      release();
      data_ = o.data_;
      size_ = o.size_;
      meta_ = o.meta_;
      o.data_ = nullptr;
      o.size_ = o.meta_ = 0;
    }
    return *this;
  }
  item_list& operator=(std::initializer_list<value*> init) {
    assign(init.begin(), init.end());
    return *this;
  }
  item_list& operator=(const std::vector<value*>& v) {
    assign(v.data(), v.data() + v.size());
    return *this;
  }
  ~item_list() { release(); }

  /// Uses `n` elements at `storage`, which someone else keeps for as long as this list
  /// borrows them (the document's arena); the list may still change them in place.
  void borrow(value** storage, size_t n) {
    if (n > payload::kMaxCapacity) throw std::bad_alloc();
    release();
    data_ = storage;
    size_ = uint32_t(n);
    meta_ = 0;
  }

  size_t size() const { return holds_items() ? size_ : 0; }
  bool empty() const { return size() == 0; }
  value*& operator[](size_t i) { return data()[i]; }
  value* operator[](size_t i) const { return data()[i]; }
  value* at(size_t i) const {
    if (i >= size()) throw std::out_of_range("item_list::at");
    return data()[i];
  }
  value*& back() { return data()[size() - 1]; }
  value* back() const { return data()[size() - 1]; }
  value*& front() { return data()[0]; }
  value* front() const { return data()[0]; }
  iterator begin() { return data(); }
  iterator end() { return data() + size(); }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size(); }
  // Null when the shared bytes hold text: no element is ever read out of a string.
  value** data() { return holds_items() ? data_ : nullptr; }
  value* const* data() const { return holds_items() ? data_ : nullptr; }
  std::vector<value*> to_vector() const { return {begin(), end()}; }
  bool operator==(const item_list& o) const {
    return size() == o.size() && (size() == 0 || std::memcmp(data(), o.data(), size() * sizeof(value*)) == 0);
  }
  bool operator!=(const item_list& o) const { return !(*this == o); }

  void clear() {
    if (holds_items()) size_ = 0;  // a node's text is not its elements' to clear
  }
  void reserve(size_t n) {
    if (n > capacity()) grow_to(n);
  }
  void push_back(value* v) {
    if (size() >= capacity()) grow_to(size() < 4 ? 4 : size() * 2);
    data_[size_++] = v;
  }
  void pop_back() { --size_; }
  void resize(size_t n, value* fill = nullptr) {
    if (!holds_items()) {
      if (n == 0) return;
      release();
    }
    reserve(n);
    for (size_t i = size_; i < n; ++i) data_[i] = fill;
    size_ = uint32_t(n);
  }
  void assign(size_t n, value* fill) {
    clear();
    resize(n, fill);
  }
  template <class It>
  void assign(It first, It last) {
    size_t n = size_t(last - first);
    if (!holds_items()) release();
    if (n > capacity()) grow_to(n, false);  // exact: most lists are built once from the stack
    if (n == 0) {
      size_ = 0;
      return;
    }
    size_ = uint32_t(n);
    for (size_t i = 0; i < n; ++i, ++first) data_[i] = *first;
  }
  // Inserts [first, last) before pos; pos must point into this list.
  template <class It>
  iterator insert(const_iterator pos, It first, It last) {
    size_t at = size_t(pos - data()), n = size_t(last - first);
    if (n == 0) return data() + at;
    if (size() + n > capacity()) grow_to(std::max<size_t>(size() + n, size() * 2));
    if (size_ > at) std::memmove(data_ + at + n, data_ + at, (size_ - at) * sizeof(value*));
    for (size_t i = 0; i < n; ++i, ++first) data_[at + i] = *first;
    size_ += uint32_t(n);
    return data_ + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<value*> init) {
    return insert(pos, init.begin(), init.end());
  }
  iterator insert(const_iterator pos, value* v) { return insert(pos, &v, &v + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    size_t at = size_t(first - data_), n = size_t(last - first);
    if (size_ > at + n) std::memmove(data_ + at, data_ + at + n, (size_ - at - n) * sizeof(value*));
    size_ -= uint32_t(n);
    return data_ + at;
  }

 private:
  bool holds_items() const { return (meta_ & payload::kText) == 0; }
  bool borrowed() const { return holds_items() && data_ && meta_ == 0; }
  // What fits without moving: a borrowed list has no room to grow into.
  size_t capacity() const { return !holds_items() ? 0 : borrowed() ? size_ : meta_; }
  // Frees what the shared 16 bytes own, elements or text.
  void release() {
    payload::release(data_, meta_);
    data_ = nullptr;
    size_ = 0;
    meta_ = 0;
  }
  // Sizes are below 2^30 (the capacity's bits in the shared word): a container of a
  // billion elements is 8 GiB of pointers, far past limits::max_values.
  // `keep`: the current elements must survive (not so for assign()).
  void grow_to(size_t n, bool keep = true) {
    if (n > payload::kMaxCapacity) throw std::bad_alloc();
    if (!holds_items()) release();
    void* p;
    if (borrowed() || !data_) {
      p = std::malloc(n * sizeof(value*));
      if (p && keep && size_) std::memcpy(p, data_, size_t(size_) * sizeof(value*));
      if (!p) throw std::bad_alloc();
    } else {
      p = std::realloc(data_, n * sizeof(value*));
      if (!p) throw std::bad_alloc();
    }
    data_ = static_cast<value**>(p);
    meta_ = uint32_t(n);
  }

  // The same layout as node_text's (pointer, size, word), which shares these bytes.
  value** data_ = nullptr;
  uint32_t size_ = 0;
  uint32_t meta_ = 0;  // capacity when malloc'd; 0 when borrowed or empty
};

}  // namespace ckpt::pickle
