#include "rekey/dcp_planner_path.h"
#include "base/text.h"

#include <string_view>

namespace ckpt::dcp {
namespace {

std::string text_of(const path_element& e) { return e.is_index ? std::to_string(e.index) : e.key; }

bool same(const std::vector<path_element>& a, const std::vector<path_element>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].is_index != b[i].is_index || a[i].key != b[i].key || a[i].index != b[i].index) return false;
  return true;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::string join_path(const std::vector<path_element>& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out += '.';
    out += text_of(path[i]);
  }
  return out;
}

std::optional<std::vector<path_element>> rename_path(const std::vector<path_element>& path,
                                                     const std::string& new_key, std::string* why) {
  std::vector<std::vector<path_element>> found;
  auto candidate = [&](std::vector<path_element> p) {
    // Built by construction to spell new_key; checked all the same, since a path that does
    // not would send set_element somewhere else.
    if (join_path(p) != new_key) return;
    for (const auto& f : found)
      if (same(f, p)) return;
    found.push_back(std::move(p));
  };
  const size_t n = path.size();
  for (size_t k = 0; k < n; ++k) {
    // A list index is a position, not a name: renaming it would move the value elsewhere in
    // the list, so only mapping keys change.
    if (path[k].is_index) continue;
    std::vector<path_element> before(path.begin(), path.begin() + long(k));
    std::vector<path_element> after(path.begin() + long(k) + 1, path.end());
    const std::string head = before.empty() ? "" : join_path(before) + ".";
    const std::string tail = after.empty() ? "" : "." + join_path(after);
    // Element k takes the new text between the kept elements.
    if (new_key.size() >= head.size() + tail.size() && starts_with(new_key, head) && text::ends_with(new_key, tail)) {
      std::vector<path_element> p = path;
      p[k].key = new_key.substr(head.size(), new_key.size() - head.size() - tail.size());
      candidate(std::move(p));
    }
    // Element k goes: one level of nesting less (a "_orig_mod" mapping of its own).
    if (n > 1) {
      std::vector<path_element> p = before;
      p.insert(p.end(), after.begin(), after.end());
      candidate(std::move(p));
    }
  }
  if (found.size() == 1) return std::move(found[0]);
  if (why) {
    *why = found.empty() ? "the edit changes more than one level of its nesting path " + repr_path(path)
                         : "the edit fits its nesting path " + repr_path(path) + " in " +
                               std::to_string(found.size()) + " ways (" + repr_path(found[0]) + ", " +
                               repr_path(found[1]) + ")";
  }
  return std::nullopt;
}

std::string repr_path(const std::vector<path_element>& path) {
  std::string out = "(";
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out += ", ";
    out += path[i].is_index ? std::to_string(path[i].index) : "'" + path[i].key + "'";
  }
  return out + (path.size() == 1 ? ",)" : ")");
}

}  // namespace ckpt::dcp
