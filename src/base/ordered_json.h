// Internal: nlohmann::ordered_json read and built in linear time.
//
// ordered_json keeps an object's members in a vector and finds a key by scanning it, both
// in its parser (each member is inserted through operator[]) and in operator[]: an object
// of n members costs n^2/2 string comparisons. A Hugging Face index of 90,000 keys, or a
// hostile program JSON of a million one-byte keys (a .pt2 JSON record may be 512 MiB),
// then takes minutes. These keep a hash index beside the object while it is built.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckpt::detail {

/// Why parse_ordered_json gave up: `what` is nlohmann's message (it names the byte within
/// `text`), or "nested deeper than N levels".
struct json_failure {
  bool too_deep = false;
  std::string what;
};

/// `text` (one JSON value, nothing after it but whitespace) exactly as
/// nlohmann::ordered_json::parse reads it: members in first-seen order, a repeated key's
/// last value kept in its first place (Python's json.loads keeps the last value too).
/// Containers nested inside more than `max_depth` others are refused, so that recursive
/// walks of the result stay bounded. On failure calls `fail`, which must throw.
///
/// Members left out of parse_ordered_json's result: those named in `names`, of the object
/// reached from the root through `parent`'s keys (a repeated one too). Their values are
/// still checked as JSON but never built. A caller that does not need a large part of a
/// document (a program's graph nodes and the metadata of every value they make, 94% of it)
/// then pays for reading its text only.
struct left_out_members {
  std::vector<std::string_view> parent;
  std::vector<std::string_view> names;
};

nlohmann::ordered_json parse_ordered_json(std::string_view text, size_t max_depth,
                                          const std::function<void(const json_failure&)>& fail,
                                          const left_out_members& leave_out = {});

/// An ordered_json object built member by member: set() appends a new key, or replaces
/// the value of one already set, in its place (as operator[] would), without a scan.
class ordered_object_builder {
 public:
  void set(const std::string& key, nlohmann::ordered_json value);
  nlohmann::ordered_json take();

 private:
  // Not the object itself: see move_members (ordered_json.cpp) for why.
  std::vector<std::pair<std::string, nlohmann::ordered_json>> members_;
  std::unordered_map<std::string, size_t> at_;
};

}  // namespace ckpt::detail
