#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/rekey.h"
#include "ckpt/wrappers.h"
#include "report/json_input.h"
#include "rekey/rename_spec.h"
#include "base/string_index.h"
#include "base/text.h"

namespace ckpt {
namespace {

std::string join(const std::vector<std::string_view>& segments) {
  std::string out;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (i) out += '.';
    out += segments[i];
  }
  return out;
}

std::string remove_segments(const std::string& key, bool (*drop)(const std::vector<std::string_view>&, size_t)) {
  auto segments = split_key(key);
  std::vector<std::string_view> kept;
  for (size_t i = 0; i < segments.size(); ++i)
    if (!drop(segments, i)) kept.push_back(segments[i]);
  return join(kept);
}

bool is_compiled_segment(const std::vector<std::string_view>& s, size_t i) {
  return i + 1 < s.size() && s[i] == "_orig_mod";
}

// Every wrapper but a leading "model.", which is just as often a real attribute name.
bool is_strippable_wrapper(const std::vector<std::string_view>& s, size_t i) {
  return is_wrapper_segment(s, i) && s[i] != "model";
}

bool is_wrapper_or_leading_model(const std::vector<std::string_view>& s, size_t i) {
  return is_wrapper_segment(s, i);
}

}  // namespace

std::string key_op::describe() const {
  switch (kind) {
    case strip_compiled: return "--strip-compiled";
    case strip_wrappers: return "--strip-wrappers";
    case strip_prefix: return "--strip-prefix '" + arg + "'";
    case add_prefix: return "--add-prefix '" + arg + "'";
    case add_compiled: return "--add-compiled '" + arg + "'";
    case rename: return "--rename '" + arg + "'";
    case map: return "--map " + arg;
  }
  return "?";
}

std::string apply_op(const key_op& op, const std::string& key) {
  switch (op.kind) {
    case key_op::strip_compiled:
      return remove_segments(key, is_compiled_segment);
    case key_op::strip_wrappers:
      return remove_segments(key, is_strippable_wrapper);
    case key_op::strip_prefix:
      return key.compare(0, op.arg.size(), op.arg) == 0 ? key.substr(op.arg.size()) : key;
    case key_op::add_prefix:
      return op.arg + key;
    case key_op::add_compiled:
      if (op.arg.empty()) return "_orig_mod." + key;
      if (key.size() > op.arg.size() && key.compare(0, op.arg.size(), op.arg) == 0 && key[op.arg.size()] == '.')
        return op.arg + "._orig_mod" + key.substr(op.arg.size());
      return key;
    case key_op::rename:
      return apply_rename(op, key);
    case key_op::map: {
      auto it = op.mapping.find(key);
      if (it != op.mapping.end()) return it->second;
      size_t dot = key.rfind('.');
      auto mod = op.module_mapping.find(dot == std::string::npos ? std::string() : key.substr(0, dot));
      if (mod == op.module_mapping.end()) return key;
      std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
      return mod->second.empty() ? leaf : mod->second + "." + leaf;
    }
  }
  return key;
}

key_op make_map_op(std::map<std::string, std::string> mapping, std::string origin, bool follow_modules) {
  key_op op{key_op::map, std::move(origin), {}, nullptr, std::move(mapping), {}};
  if (!follow_modules) return op;
  auto module_of = [](const std::string& k) {
    size_t dot = k.rfind('.');
    return dot == std::string::npos ? std::string() : k.substr(0, dot);
  };
  std::set<std::string> conflicting;
  for (const auto& [old_key, new_key] : op.mapping) {
    std::string from = module_of(old_key), to = module_of(new_key);
    auto [it, fresh] = op.module_mapping.emplace(from, to);
    if (!fresh && it->second != to) conflicting.insert(from);
  }
  // A module whose tensors went to different places has no single new path.
  for (const auto& m : conflicting) op.module_mapping.erase(m);
  return op;
}

rekey_plan plan_rekey(std::vector<std::string> keys, const std::vector<key_op>& ops) {
  rekey_plan plan;
  // Key by key, every operation in turn (each is a function of the key alone, so this is
  // the same as operation by operation): no second copy of a million keys.
  std::vector<bool> touched(ops.size(), false);
  plan.mapping.reserve(keys.size());
  for (std::string& key : keys) {
    // The key itself until an operation changes it: no copy of a key first.
    std::string current;
    const std::string* now = &key;
    for (size_t o = 0; o < ops.size(); ++o) {
      std::string next = apply_op(ops[o], *now);
      if (next != *now) {
        touched[o] = true;
        current = std::move(next);
        now = &current;
      }
    }
    if (now == &key) current = key;
    if (key != current) plan.changed++;
    if (current.empty() && !key.empty()) plan.emptied.push_back(key);
    plan.mapping.emplace_back(std::move(key), std::move(current));
  }
  for (size_t o = 0; o < ops.size(); ++o)
    if (!touched[o]) plan.unused_ops.push_back(ops[o].describe());
  std::vector<std::string>().swap(keys);
  auto old_key = [&](size_t i) -> const std::string& { return plan.mapping[i].first; };
  // The new keys are found in place (the mapping no longer moves): a million keys cost 16
  // bytes each here, not a hash node each.
  auto new_key = [&](size_t i) -> std::string_view { return plan.mapping[i].second; };
  detail::string_index first_of(plan.mapping.size());       // new key -> first old index
  std::unordered_map<std::string_view, size_t> collision;   // new key -> index in collisions
  std::vector<size_t> first_index;                          // per collision, for the order
  for (size_t i = 0; i < plan.mapping.size(); ++i) {
    const size_t first = first_of.insert(i, new_key);
    if (first == detail::string_index::npos) continue;
    const std::string_view key = new_key(i);
    auto [c, new_collision] = collision.emplace(key, plan.collisions.size());
    if (new_collision) {
      plan.collisions.emplace_back(std::string(key), std::vector<std::string>{old_key(first)});
      first_index.push_back(first);
    }
    plan.collisions[c->second].second.push_back(old_key(i));
  }
  // In the order of each colliding group's first key, as the keys come.
  std::vector<size_t> order(plan.collisions.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return first_index[a] < first_index[b]; });
  std::vector<std::pair<std::string, std::vector<std::string>>> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(std::move(plan.collisions[i]));
  plan.collisions = std::move(sorted);
  return plan;
}

namespace {

std::string module_of(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? std::string() : key.substr(0, dot);
}
std::string leaf_of(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}
// `path` is `ancestor` or lies below it ("" is above everything).
bool within(const std::string& path, const std::string& ancestor) {
  if (ancestor.empty()) return true;
  return path == ancestor || (path.size() > ancestor.size() && path.compare(0, ancestor.size(), ancestor) == 0 &&
                              path[ancestor.size()] == '.');
}
// The longest common leading path of two module paths.
std::string common_prefix(const std::string& a, const std::string& b) {
  auto sa = split_key(a), sb = split_key(b);
  std::vector<std::string_view> common;
  for (size_t i = 0; i < sa.size() && i < sb.size() && sa[i] == sb[i] && !sa[i].empty(); ++i) common.push_back(sa[i]);
  return join(common);
}

}  // namespace

module_rules derive_module_rules(const std::vector<std::pair<std::string, std::string>>& key_mapping) {
  std::map<std::string, std::string> rules;
  std::set<std::string> conflicting;
  for (const auto& [old_key, new_key] : key_mapping) {
    if (old_key == new_key || leaf_of(old_key) != leaf_of(new_key)) continue;
    std::string mo = module_of(old_key), mn = module_of(new_key);
    auto so = split_key(mo), sn = split_key(mn);
    if (mo.empty()) so.clear();
    if (mn.empty()) sn.clear();
    while (!so.empty() && !sn.empty() && so.back() == sn.back()) {
      so.pop_back();
      sn.pop_back();
    }
    std::string from = join(so), to = join(sn);
    if (from == to) continue;
    auto [it, fresh] = rules.emplace(from, to);
    if (!fresh && it->second != to) conflicting.insert(from);
  }
  module_rules out;
  for (auto& [from, to] : rules)
    if (!conflicting.count(from)) out.rules.emplace_back(from, to);
  // Longest old prefix first: the most specific rule wins.
  std::sort(out.rules.begin(), out.rules.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return out;
}

std::string map_module_path(const module_rules& m, const std::string& path) {
  for (const auto& [from, to] : m.rules) {
    if (within(path, from)) {
      std::string rest = path.size() > from.size() ? path.substr(from.empty() ? 0 : from.size() + 1) : std::string();
      return text::join_dotted(to, rest);
    }
  }
  for (const auto& [from, to] : m.rules) {
    std::string keep = common_prefix(from, to);
    // `path` is a wrapper between the unchanged part and the removed segments.
    if (within(from, path) && within(path, keep) && path.size() >= keep.size()) return to;
  }
  return path;
}

std::vector<std::pair<std::string, std::string>> added_wrapper_paths(const module_rules& m) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [from, to] : m.rules) {
    std::string keep = common_prefix(from, to);
    // New segments between `keep` and `to`: each level is a new wrapper module.
    auto segments = split_key(to);
    if (to.empty()) continue;
    std::string current;
    size_t kept = keep.empty() ? 0 : split_key(keep).size();
    for (size_t i = 0; i < kept; ++i) current = text::join_dotted(current, std::string(segments[i]));
    for (size_t i = kept; i < segments.size(); ++i) {
      out.emplace_back(current, to);
      current = text::join_dotted(current, std::string(segments[i]));
    }
  }
  return out;
}

match_result match_keys(const std::vector<keyed_tensor>& source, const std::vector<keyed_tensor>& target) {
  using reducer = bool (*)(const std::vector<std::string_view>&, size_t);
  struct variant {
    const char* name;
    reducer drop;
  };
  const variant variants[] = {
      {"identity", [](const std::vector<std::string_view>&, size_t) { return false; }},
      {"wrapper segments", is_strippable_wrapper},
      {"wrapper segments and a leading 'model.'", is_wrapper_or_leading_model},
  };

  std::vector<match_result> full;
  match_result best;
  size_t best_matched = 0;
  for (const auto& v : variants) {
    match_result r;
    std::unordered_map<std::string, std::vector<size_t>> tgt_by_reduced, src_by_reduced;
    for (size_t i = 0; i < target.size(); ++i) tgt_by_reduced[remove_segments(target[i].key, v.drop)].push_back(i);
    for (size_t i = 0; i < source.size(); ++i) src_by_reduced[remove_segments(source[i].key, v.drop)].push_back(i);
    std::string clash;
    for (auto& [reduced, idx] : tgt_by_reduced)
      if (idx.size() > 1) clash = "target keys '" + target[idx[0]].key + "' and '" + target[idx[1]].key + "' both reduce to '" + reduced + "'";
    for (auto& [reduced, idx] : src_by_reduced)
      if (idx.size() > 1) clash = "source keys '" + source[idx[0]].key + "' and '" + source[idx[1]].key + "' both reduce to '" + reduced + "'";
    std::vector<bool> target_hit(target.size(), false);
    for (size_t i = 0; i < source.size(); ++i) {
      auto it = tgt_by_reduced.find(remove_segments(source[i].key, v.drop));
      if (it == tgt_by_reduced.end() || it->second.size() != 1) {
        r.unexpected.push_back(source[i].key);
        continue;
      }
      size_t t = it->second[0];
      target_hit[t] = true;
      r.mapping.emplace_back(source[i].key, target[t].key);
      if (source[i].shape != target[t].shape) {
        r.shape_mismatches.push_back(target[t].key + ": checkpoint " + text::shape(source[i].shape) + " vs model " +
                                     text::shape(target[t].shape));
      }
      if (source[i].type != target[t].type)
        r.dtype_mismatches.push_back(target[t].key + ": checkpoint " + name(source[i].type) + " vs model " +
                                     name(target[t].type));
    }
    for (size_t t = 0; t < target.size(); ++t)
      if (!target_hit[t]) r.missing.push_back(target[t].key);
    r.ambiguity = clash;
    r.ok = clash.empty() && r.missing.empty() && r.unexpected.empty();
    r.edit = std::string("pair keys after removing ") + v.name;
    if (r.ok) full.push_back(r);
    if (r.mapping.size() > best_matched || (best_matched == 0 && best.edit.empty())) {
      best_matched = r.mapping.size();
      best = r;
    }
  }
  if (full.empty()) {
    best.ok = false;
    return best;
  }
  // Several reductions that each match everything must agree on the pairing.
  for (size_t i = 1; i < full.size(); ++i) {
    auto a = full[0].mapping, b = full[i].mapping;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) {
      match_result r = full[0];
      r.ok = false;
      r.ambiguity = "removing " + std::string(full[0].edit) + " and " + full[i].edit + " give different pairings";
      return r;
    }
  }
  match_result r = full[0];
  // Name the edit by what actually changes: the segments dropped or added.
  std::set<std::string> removed, added;
  for (auto& [s, t] : r.mapping) {
    auto ss = split_key(s), ts = split_key(t);
    for (auto x : ss)
      if (std::find(ts.begin(), ts.end(), x) == ts.end()) removed.insert(std::string(x) + ".");
    for (auto x : ts)
      if (std::find(ss.begin(), ss.end(), x) == ss.end()) added.insert(std::string(x) + ".");
  }
  if (removed.empty() && added.empty()) {
    r.edit = "none (the keys already match)";
  } else {
    r.edit.clear();
    for (auto& s : removed) r.edit += (r.edit.empty() ? "" : ", ") + ("remove '" + s + "'");
    for (auto& s : added) r.edit += (r.edit.empty() ? "" : ", ") + ("add '" + s + "'");
  }
  return r;
}

std::string mapping_to_json(const std::vector<std::pair<std::string, std::string>>& mapping) {
  nlohmann::ordered_json m = nlohmann::ordered_json::object();
  for (auto& [a, b] : mapping) m[a] = b;
  nlohmann::ordered_json doc = {{"ckptool_key_map", kKeyMapVersion}, {"mapping", m}};
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::map<std::string, std::string> mapping_from_json(const std::string& text, const std::string& file) {
  nlohmann::json doc;
  try {
    doc = parse_json_unique_keys(text, "key map");
  } catch (error& e) {
    e.with_file(file);
    throw;
  }
  const char* shape = "key map must be {\"ckptool_key_map\": 1, \"mapping\": {old: new}}";
  if (!doc.is_object()) throw error(errc::usage, shape).with_file(file);
  auto version = doc.find("ckptool_key_map");
  if (version == doc.end())
    throw error(errc::unsupported, "not a ckptool key map: no \"ckptool_key_map\" format version").with_file(file);
  if (!version->is_number_integer() || version->get<int64_t>() != kKeyMapVersion)
    throw error(errc::unsupported, "key map format version " + version->dump() + " is not supported (this ckptool reads version " +
                                       std::to_string(kKeyMapVersion) + ")")
        .with_file(file);
  if (!doc.contains("mapping") || !doc["mapping"].is_object()) throw error(errc::usage, shape).with_file(file);
  std::map<std::string, std::string> out;
  for (auto& [k, v] : doc["mapping"].items()) {
    if (!v.is_string()) throw error(errc::usage, "key map value for '" + k + "' is not a string").with_file(file);
    out[k] = v.get<std::string>();
  }
  return out;
}

std::vector<keyed_tensor> keyed_tensors(const checkpoint& c) {
  std::vector<keyed_tensor> out;
  out.reserve(c.keys.size());
  for (size_t k = 0; k < c.keys.size(); ++k)
    out.push_back({std::string(c.keys.key(k)), c.keys.type(k, c.tensors), c.keys.shape(k, c.tensors)});
  return out;
}

namespace {

std::string first_few(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 5; ++i) s += (i ? ", " : "") + v[i];
  return v.size() > 5 ? s + ", ..." : s;
}

}  // namespace

match_result align_keys(const std::vector<keyed_tensor>& source, const std::vector<keyed_tensor>& target,
                        const align_policy& policy, const std::string& file) {
  match_result m = match_keys(source, target);
  const std::string context = "cannot align the checkpoint to " + policy.target + ": ";
  if (!m.ambiguity.empty()) throw error(errc::check_failed, context + "ambiguous, refusing: " + m.ambiguity).with_file(file);
  std::vector<std::string> unpaired;
  if (!policy.allow_missing && !m.missing.empty())
    unpaired.push_back(std::to_string(m.missing.size()) + " " + policy.target_noun +
                       " tensors are missing from the checkpoint (" + first_few(m.missing) + ")" + policy.missing_hint);
  if (!policy.allow_unexpected && !m.unexpected.empty())
    unpaired.push_back(std::to_string(m.unexpected.size()) + " checkpoint tensors have no " + policy.target_noun +
                       " tensor (" + first_few(m.unexpected) + ")");
  if (!unpaired.empty()) {
    std::string why = "no wrapper-segment edit pairs every key: " + unpaired[0];
    for (size_t i = 1; i < unpaired.size(); ++i) why += "; " + unpaired[i];
    throw error(errc::check_failed, context + why).with_file(file);
  }
  if (!m.shape_mismatches.empty())
    throw error(errc::check_failed, context + "keys align but " + std::to_string(m.shape_mismatches.size()) +
                                        " shapes differ: " + first_few(m.shape_mismatches))
        .with_file(file);
  return m;
}

}  // namespace ckpt
