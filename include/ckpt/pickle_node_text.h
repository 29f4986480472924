// The text of a pickle node (str, bytes, bytearray, big integer) in 16 bytes, where a
// std::string takes 32 and allocates past 15 characters. A checkpoint of a million tensors
// has millions of nodes, most without text: the 16 bytes saved on each, and the allocation
// saved on each long key, are a large part of what its decoded pickle costs.
//
// Text the pickle machine decodes is borrowed: it lives in the document's arena (see
// document::keep) and the node only points at it. Text assigned later (a renamed key, a
// node built by hand) is copied and owned by the node. Either way it reads like a
// std::string_view and converts to std::string where one is needed.
//
// A node's text and its element list (item_list) share their 16 bytes: no node has both,
// and 16 bytes a node were 112 a tensor. Whichever holds them says so in the last word
// (payload::kText), and the other then reads as empty: a str node has no elements, a list
// has no text, exactly as when each had bytes of its own.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <ostream>
#include <string>
#include <string_view>

namespace ckpt::pickle {

// The 16 bytes a node_text and an item_list share: a pointer, a 32-bit size, a 32-bit word
// saying what they hold.
namespace payload {
constexpr uint32_t kText = uint32_t(1) << 31;   // text (else an element list, or nothing)
constexpr uint32_t kOwned = uint32_t(1) << 30;  // text malloc'd by the node
// An element list's capacity is the word itself: 0 for a borrowed (or no) array, else the
// size of the array the list malloc'd, below kOwned.
constexpr uint32_t kMaxCapacity = kOwned - 1;
constexpr uint64_t kMaxText = UINT32_MAX;
/// Frees what `meta` says the node owns at `data`.
inline void release(const void* data, uint32_t meta) {
  if (meta & kText) {
    if (meta & kOwned) std::free(const_cast<void*>(data));
  } else if (meta != 0) {
    std::free(const_cast<void*>(data));
  }
}
}  // namespace payload

class node_text {
 public:
  node_text() = default;
  node_text(const node_text& o) { copy_in(o.view()); }
  node_text(node_text&& o) noexcept : data_(o.data_), size_(o.size_), meta_(o.meta_) { o.forget(); }
  node_text& operator=(const node_text& o) {
    if (this != &o) assign(o.view());
    return *this;
  }
  node_text& operator=(node_text&& o) noexcept {
    if (this != &o) {
      release();
      data_ = o.data_;
      size_ = o.size_;
      meta_ = o.meta_;
      o.forget();
    }
    return *this;
  }
  node_text& operator=(std::string_view s) {
    assign(s);
    return *this;
  }
  node_text& operator=(const std::string& s) {
    assign(s);
    return *this;
  }
  node_text& operator=(const char* s) {
    assign(std::string_view(s));
    return *this;
  }
  ~node_text() { release(); }

  /// Points at bytes that someone else keeps, unchanged, for as long as this node lives
  /// (the document's arena).
  void borrow(std::string_view s) {
    if (s.size() > payload::kMaxText) throw std::bad_alloc();
    release();
    if (s.empty()) return;
    data_ = s.data();
    size_ = uint32_t(s.size());
    meta_ = payload::kText;
  }
  /// Copies `s` into storage of its own.
  void assign(std::string_view s) {
    if (owned() && s.data() >= data_ && s.data() < data_ + size_) {  // a piece of itself
      node_text copy;
      copy.copy_in(s);
      *this = std::move(copy);
      return;
    }
    release();
    copy_in(s);
  }

  size_t size() const { return holds_text() ? size_t(size_) : 0; }
  size_t length() const { return size(); }
  bool empty() const { return size() == 0; }
  const char* data() const { return holds_text() && data_ ? data_ : ""; }
  const char* begin() const { return data(); }
  const char* end() const { return data() + size(); }
  char operator[](size_t i) const { return data()[i]; }
  char front() const { return data()[0]; }
  char back() const { return data()[size() - 1]; }
  size_t find(char c, size_t from = 0) const { return view().find(c, from); }
  size_t find(std::string_view s, size_t from = 0) const { return view().find(s, from); }
  std::string_view substr(size_t pos, size_t n = std::string_view::npos) const { return view().substr(pos, n); }
  int compare(std::string_view s) const { return view().compare(s); }

  std::string_view view() const { return {data(), size()}; }
  std::string str() const { return std::string(view()); }
  operator std::string_view() const { return view(); }
  operator std::string() const { return str(); }

  friend bool operator==(const node_text& a, const node_text& b) { return a.view() == b.view(); }
  friend bool operator==(const node_text& a, std::string_view b) { return a.view() == b; }
  friend bool operator==(std::string_view a, const node_text& b) { return a == b.view(); }
  friend bool operator!=(const node_text& a, const node_text& b) { return !(a == b); }
  friend bool operator!=(const node_text& a, std::string_view b) { return !(a == b); }
  friend bool operator!=(std::string_view a, const node_text& b) { return !(a == b); }
  friend bool operator<(const node_text& a, const node_text& b) { return a.view() < b.view(); }

  friend std::string operator+(const char* a, const node_text& b) { return std::string(a).append(b.view()); }
  friend std::string operator+(std::string a, const node_text& b) { return a.append(b.view()); }
  friend std::string operator+(const node_text& a, std::string_view b) { return a.str().append(b); }
  friend std::string operator+(const node_text& a, const char* b) { return a.str().append(b); }
  friend std::string operator+(const node_text& a, char b) { return a.str() + b; }
  friend std::ostream& operator<<(std::ostream& os, const node_text& t) { return os << t.view(); }

 private:
  bool holds_text() const { return (meta_ & payload::kText) != 0; }
  bool owned() const { return holds_text() && (meta_ & payload::kOwned); }
  void copy_in(std::string_view s) {
    forget();
    if (s.empty()) return;
    if (s.size() > payload::kMaxText) throw std::bad_alloc();
    char* p = static_cast<char*>(std::malloc(s.size()));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, s.data(), s.size());
    data_ = p;
    size_ = uint32_t(s.size());
    meta_ = payload::kText | payload::kOwned;
  }
  // Frees what the shared 16 bytes own, text or elements.
  void release() {
    payload::release(data_, meta_);
    forget();
  }
  void forget() {
    data_ = nullptr;
    size_ = 0;
    meta_ = 0;
  }

  // The same layout as item_list's (pointer, size, word), which shares these bytes.
  const char* data_ = nullptr;
  uint32_t size_ = 0;
  uint32_t meta_ = 0;
};

}  // namespace ckpt::pickle
