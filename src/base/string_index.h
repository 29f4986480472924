// Internal: finds strings kept elsewhere (zip entry names, state-dict keys) by content.
// Open addressing over one array of positions: a million names cost 16 bytes each here,
// where std::unordered_map<std::string_view, size_t> allocated a node per name, which was
// a tenth of what rekeying a million tiny tensors cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace ckpt::detail {

class string_index {
 public:
  static constexpr size_t npos = ~size_t(0);

  /// For up to `capacity` strings.
  explicit string_index(size_t capacity) {
    size_t cap = 16;
    while (cap < 2 * capacity) cap *= 2;
    slots_.assign(cap, 0);
    mask_ = cap - 1;
    // A slot keeps 32 bits of its string's hash beside the position, so a probe that meets
    // another string almost never has to fetch it to compare (a cache miss or two each,
    // most of what indexing a million zip names cost). Positions then take 32 bits.
    tagged_ = capacity < (uint64_t(1) << 32) - 1;
  }

  /// Adds position `i`, whose string is key_of(i), unless an equal string is there: then
  /// returns that string's position and adds nothing; else npos. At most `capacity` adds.
  template <class KeyOf>
  size_t insert(size_t i, KeyOf&& key_of) {
    const std::string_view key = key_of(i);
    const uint64_t h = hash(key);
    size_t s = h & mask_;
    for (; slots_[s]; s = (s + 1) & mask_)
      if (may_match(slots_[s], h) && key_of(position(slots_[s])) == key) return position(slots_[s]);
    slots_[s] = make_slot(i, h);
    return npos;
  }

  /// The position whose string equals `key`, or npos.
  template <class KeyOf>
  size_t find(std::string_view key, KeyOf&& key_of) const {
    const uint64_t h = hash(key);
    for (size_t s = h & mask_; slots_[s]; s = (s + 1) & mask_)
      if (may_match(slots_[s], h) && key_of(position(slots_[s])) == key) return position(slots_[s]);
    return npos;
  }

 private:
  static uint64_t hash(std::string_view key) { return std::hash<std::string_view>()(key); }
  uint64_t make_slot(size_t i, uint64_t h) const {
    return tagged_ ? ((h >> 32) << 32) | (uint64_t(i) + 1) : uint64_t(i) + 1;
  }
  size_t position(uint64_t slot) const { return size_t(tagged_ ? (slot & 0xFFFFFFFFu) : slot) - 1; }
  bool may_match(uint64_t slot, uint64_t h) const { return !tagged_ || (slot >> 32) == (h >> 32); }

  std::vector<uint64_t> slots_;  // 1 + position (and the hash tag); 0 empty
  size_t mask_ = 0;
  bool tagged_ = true;
};

}  // namespace ckpt::detail
