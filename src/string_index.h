// Internal: finds strings kept elsewhere (zip entry names, state-dict keys) by content.
// Open addressing over one array of positions: a million names cost 16 bytes each here,
// where std::unordered_map<std::string_view, size_t> allocated a node per name, which was
// a tenth of what rekeying a million tiny tensors cost.
#pragma once

#include <cstddef>
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
  }

  /// Adds position `i`, whose string is key_of(i), unless an equal string is there: then
  /// returns that string's position and adds nothing; else npos. At most `capacity` adds.
  template <class KeyOf>
  size_t insert(size_t i, KeyOf&& key_of) {
    const std::string_view key = key_of(i);
    size_t s = slot_of(key);
    for (; slots_[s]; s = (s + 1) & mask_)
      if (key_of(slots_[s] - 1) == key) return slots_[s] - 1;
    slots_[s] = i + 1;
    return npos;
  }

  /// The position whose string equals `key`, or npos.
  template <class KeyOf>
  size_t find(std::string_view key, KeyOf&& key_of) const {
    for (size_t s = slot_of(key); slots_[s]; s = (s + 1) & mask_)
      if (key_of(slots_[s] - 1) == key) return slots_[s] - 1;
    return npos;
  }

 private:
  size_t slot_of(std::string_view key) const { return std::hash<std::string_view>()(key) & mask_; }

  std::vector<size_t> slots_;  // 1 + position; 0 empty
  size_t mask_ = 0;
};

}  // namespace ckpt::detail
