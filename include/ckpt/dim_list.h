// A tensor's shape or stride: a std::vector<int64_t> look-alike that keeps up to three
// dimensions in itself. A checkpoint of a million small tensors held two million 8-byte heap
// blocks (32 bytes each with malloc's header) for shapes and strides, plus the calls to
// make and free them; almost every tensor has rank 3 or less.
//
// It reads and converts like the vector it replaces (size, operator[], begin/end, ==, data,
// push_back, assign, implicit conversion to and from std::vector<int64_t>; LibTorch's
// IntArrayRef takes it directly through data() and size()).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <vector>

namespace ckpt {

class dim_list {
 public:
  using value_type = int64_t;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = int64_t&;
  using const_reference = const int64_t&;
  using pointer = int64_t*;
  using const_pointer = const int64_t*;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;

  static constexpr size_t kInline = 3;

  dim_list() noexcept {}
  dim_list(std::initializer_list<int64_t> init) { assign(init.begin(), init.end()); }
  dim_list(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }  // NOLINT: a drop-in
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  dim_list(It first, It last) {
    assign(first, last);
  }
  explicit dim_list(size_t n, int64_t v = 0) { assign(n, v); }
  dim_list(const dim_list& o) { assign(o.begin(), o.end()); }
  dim_list(dim_list&& o) noexcept { take(o); }
  dim_list& operator=(const dim_list& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  dim_list& operator=(dim_list&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  dim_list& operator=(const std::vector<int64_t>& v) {
    assign(v.begin(), v.end());
    return *this;
  }
  dim_list& operator=(std::initializer_list<int64_t> init) {
    assign(init.begin(), init.end());
    return *this;
  }
  ~dim_list() { release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return cap_; }
  int64_t* data() { return heap() ? heap_ : inline_; }
  const int64_t* data() const { return heap() ? heap_ : inline_; }
  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }
  std::reverse_iterator<const_iterator> rbegin() const { return std::reverse_iterator<const_iterator>(end()); }
  std::reverse_iterator<const_iterator> rend() const { return std::reverse_iterator<const_iterator>(begin()); }
  int64_t& operator[](size_t i) { return data()[i]; }
  const int64_t& operator[](size_t i) const { return data()[i]; }
  int64_t& front() { return data()[0]; }
  const int64_t& front() const { return data()[0]; }
  int64_t& back() { return data()[size_ - 1]; }
  const int64_t& back() const { return data()[size_ - 1]; }

  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n <= cap_) return;
    int64_t* p = new int64_t[n];
    const uint32_t size = size_;
    if (size) std::memcpy(p, data(), size * sizeof(int64_t));
    release();
    heap_ = p;
    size_ = size;
    cap_ = uint32_t(n);
  }
  void push_back(int64_t v) {
    if (size_ == cap_) reserve(size_t(cap_) * 2);
    data()[size_++] = v;
  }
  void pop_back() { --size_; }
  void resize(size_t n, int64_t v = 0) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = v;
    size_ = uint32_t(n);
  }
  void assign(size_t n, int64_t v) {
    clear();
    resize(n, v);
  }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  void assign(It first, It last) {
    const size_t n = size_t(std::distance(first, last));
    clear();
    reserve(n);
    std::copy(first, last, data());
    size_ = uint32_t(n);
  }

  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  operator std::vector<int64_t>() const { return vec(); }  // NOLINT: a drop-in

  friend bool operator==(const dim_list& a, const dim_list& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const dim_list& a, const dim_list& b) { return !(a == b); }
  // Lexicographic, as std::vector orders (sorting boxes by their coordinates).
  friend bool operator<(const dim_list& a, const dim_list& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const dim_list& a, const std::vector<int64_t>& b) {
    return a.size_ == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const std::vector<int64_t>& a, const dim_list& b) { return b == a; }
  friend bool operator!=(const dim_list& a, const std::vector<int64_t>& b) { return !(a == b); }
  friend bool operator!=(const std::vector<int64_t>& a, const dim_list& b) { return !(b == a); }

 private:
  bool heap() const { return cap_ > kInline; }
  void release() {
    if (heap()) delete[] heap_;
    size_ = 0;
    cap_ = kInline;
  }
  void take(dim_list& o) noexcept {
    size_ = o.size_;
    cap_ = o.cap_;
    if (o.heap())
      heap_ = o.heap_;
    else
      std::memcpy(inline_, o.inline_, sizeof inline_);
    o.size_ = 0;
    o.cap_ = kInline;
  }

  uint32_t size_ = 0;
  uint32_t cap_ = kInline;  // more than kInline: the dimensions are at heap_
  union {
    int64_t inline_[kInline] = {};
    int64_t* heap_;
  };
};

}  // namespace ckpt
