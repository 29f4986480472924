// Python's notion of "the same key" for dict keys and set elements, so that the pickle
// machine can give SETITEM(S), DICT, ADDITEMS and set(...) their real semantics: a repeated
// key replaces the value in place, a repeated element is dropped. Internal to the reader.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ckpt/pickle.h"

namespace ckpt::pickle::detail {

class key_table {
 public:
  /// An id that two keys share exactly when Python finds them equal: 1 == 1.0 == True,
  /// tuples and frozensets by content, globals by name, objects and NaNs by identity.
  /// Returns 0 for an unhashable key (list, dict, set, bytearray, or a tuple holding one)
  /// and names its type in unhashable_type().
  uint64_t id(const value* key);
  /// Shortcut for small containers: compares without building ids where it can.
  bool equal(const value* a, const value* b);
  const char* unhashable_type() const { return unhashable_; }

 private:
  uint64_t scalar_id(const value* v);
  uint64_t composite_id(const value* v);
  uint64_t intern(std::unordered_map<std::string, uint64_t>* table, std::string key);
  uint64_t fresh() { return next_++; }

  uint64_t next_ = 2;  // 0: unhashable; 1: None
  const char* unhashable_ = "";
  std::unordered_map<int64_t, uint64_t> ints_;
  std::unordered_map<uint64_t, uint64_t> floats_;  // non-integral, by bit pattern
  // str and bytes keys point into node text, which never changes after creation.
  std::unordered_map<std::string_view, uint64_t> strs_;
  std::unordered_map<std::string_view, uint64_t> bytes_;
  std::unordered_map<std::string, uint64_t> others_;    // big ints, globals, tuples, frozensets
  std::unordered_map<const value*, uint64_t> by_node_;  // identity ids and composite cache
};

}  // namespace ckpt::pickle::detail
