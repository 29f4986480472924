// Internal: a hash map keyed by pointers (pickle nodes), open addressing in one array.
// Walking a checkpoint of 100,000 tensors asks "seen this node?" millions of times;
// std::unordered_map allocates a node per entry, which was most of what those walks cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckpt::detail {

template <class V>
class pointer_map {
 public:
  explicit pointer_map(size_t expected = 0) { rehash(capacity_for(expected)); }

  /// The value stored for `key`, or nullptr. A null key is never stored.
  V* find(const void* key) {
    if (!key) return nullptr;
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (!slots_[i].key) return nullptr;
    }
  }
  const V* find(const void* key) const { return const_cast<pointer_map*>(this)->find(key); }
  bool contains(const void* key) const { return find(key) != nullptr; }

  /// Inserts (key, value) unless `key` is present; returns whether it inserted.
  bool insert(const void* key, V value) {
    if (!key || find(key)) return false;
    put(key, value);
    return true;
  }
  /// Inserts or overwrites.
  void assign(const void* key, V value) {
    if (!key) return;
    if (V* v = find(key))
      *v = value;
    else
      put(key, value);
  }
  size_t size() const { return size_; }
  /// Calls f(key, value) for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const slot& s : slots_)
      if (s.key) f(s.key, s.value);
  }

 private:
  struct slot {
    const void* key = nullptr;
    V value{};
  };

  static size_t capacity_for(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
  }
  size_t slot_of(const void* key) const {
    // Fibonacci hashing; the low bits of node addresses are alignment, the high ones spread.
    uint64_t h = uint64_t(reinterpret_cast<uintptr_t>(key)) * 0x9E3779B97F4A7C15ull;
    return size_t(h >> shift_);
  }
  void put(const void* key, V value) {
    if (2 * (size_ + 1) > slots_.size()) rehash(slots_.size() * 2);
    size_t i = slot_of(key);
    while (slots_[i].key) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }
  void rehash(size_t cap) {
    std::vector<slot> old = std::move(slots_);
    slots_.assign(cap, slot{});
    mask_ = cap - 1;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (const slot& s : old)
      if (s.key) put(s.key, s.value);
  }

  std::vector<slot> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
  unsigned shift_ = 64;
};

}  // namespace ckpt::detail
