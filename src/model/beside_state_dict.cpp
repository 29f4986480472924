#include "model/beside_state_dict.h"

#include <algorithm>
#include <set>

#include "model/assembly.h"

namespace ckpt::detail {
namespace {

bool starts_with(const value_path& p, const value_path& prefix) {
  return p.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), p.begin());
}

}  // namespace

std::vector<size_t> tensors_beside_state_dict(const checkpoint& c) {
  std::vector<size_t> out;
  if (!c.state_dict || c.state_dict->empty()) return out;
  std::vector<bool> keyed(c.tensors.size(), false);
  for (size_t k = 0; k < c.keys.size(); ++k) {
    if (!is_assembled(c.keys, k)) {
      keyed[c.keys.tensor(k)] = true;
      continue;
    }
    for (size_t p = 0; p < c.keys.piece_count(k); ++p)
      if (const size_t t = c.keys.piece(k, p).tensor; t < keyed.size()) keyed[t] = true;
  }
  std::set<value_path> entry_paths;
  for (const entry_summary& e : c.entries) entry_paths.insert(e.path);
  auto in_an_entry = [&](const value_path& p) {
    value_path prefix;
    for (const path_element& x : p) {
      prefix.push_back(x);
      if (entry_paths.count(prefix)) return true;
    }
    return false;
  };
  for (size_t t = 0; t < c.tensors.size(); ++t) {
    const value_path& p = c.tensors[t].path;
    if (!keyed[t] && !starts_with(p, *c.state_dict) && !in_an_entry(p)) out.push_back(t);
  }
  return out;
}

}  // namespace ckpt::detail
