#include "ckpt/diff.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/error.h"
#include "base/text.h"
#include "ckpt/rekey.h"
#include "ckpt/wrappers.h"
#include "diff/entry_leaves.h"
#include "diff/key_reader.h"
#include "diff/value_compare.h"
#include "model/assembly.h"
#include "model/beside_state_dict.h"
#include "ckpt/pickle.h"

namespace ckpt {
namespace {

// A tensor record's name: its path's elements joined by `separator`, an integer element (a
// list or tuple index, an int dict key) as "[N]", so that torch.save([t]) or {0: t} never
// pairs with a state dict's key "0" (torch.load gives a list, or a dict keyed by 0).
std::string record_name(const value_path& path, char separator) {
  std::string out;
  for (const path_element& e : path) {
    if (const int64_t* n = std::get_if<int64_t>(&e)) {
      out += "[" + std::to_string(*n) + "]";
      continue;
    }
    if (!out.empty()) out += separator;
    out += std::get<std::string>(e);
  }
  return out;
}

// One side's tensors as diff names them: the state dict's keys; for a checkpoint without
// one (TorchScript, whose keys only LibTorch names, or a file with no dict of tensors),
// every tensor record by its path in the file. A checkpoint whose tensors all lie inside
// its entries ({"mixed": (t, 3)}) has no keys, not a key per tensor: its tensors are entry
// leaves, paired by path with the other side's (which keeps them there too, keys or not).
struct side {
  const checkpoint& c;
  std::vector<std::string> names;   // the names keys are paired by
  std::vector<std::string> labels;  // the checkpoint's own, where edits made `names` (edit)
  std::vector<size_t> ids;  // key index (by_key) or tensor record index
  bool by_key = true;
  detail::assembly assembled;
  std::vector<int64_t> assembled_of_key;  // index into assembled.tensors, -1 when whole
  std::vector<bool> record;  // by_key: true where ids[i] is a tensor record (is_record)

  explicit side(const checkpoint& cp) : c(cp) {
    if (!c.keys.empty() || c.tensors.empty() || !c.entries.empty()) {
      std::vector<size_t> all(c.keys.size());
      for (size_t k = 0; k < c.keys.size(); ++k) {
        names.emplace_back(c.keys.key(k));
        ids.push_back(k);
        all[k] = k;
      }
      assembled = detail::plan_assembly(c, all);
      assembled_of_key.assign(c.keys.size(), -1);
      for (size_t j = 0; j < assembled.tensors.size(); ++j) assembled_of_key[assembled.tensors[j].key] = int64_t(j);
      add_tensors_beside_state_dict();
      return;
    }
    by_key = false;
    const char separator = c.format == file_format::torchscript ? '.' : '/';
    for (size_t t = 0; t < c.tensors.size(); ++t) {
      names.push_back(record_name(c.tensors[t].path, separator));
      ids.push_back(t);
    }
  }

  // A state dict below the root leaves the root's own tensors out of its keys, and out of
  // the entries ({'w': t1, 'opt': {'w': t2}}: 'w' is neither): they are compared too, named
  // by their path as materialize names them, or a change in one would pass as equivalent.
  // Such a name that a key has already is refused, as materialize refuses it.
  void add_tensors_beside_state_dict() {
    const std::vector<size_t> beside = detail::tensors_beside_state_dict(c);
    if (beside.empty()) return;
    std::unordered_set<std::string> key_names(names.begin(), names.end());
    record.assign(names.size(), false);
    for (size_t t : beside) {
      std::string name = record_name(c.tensors[t].path, '.');
      if (key_names.count(name))
        throw error(errc::unsupported, "two different tensors would both be named " + text::in_quotes(name) +
                                           ": key " + text::in_quotes(name) + " of the state dict at " +
                                           text::in_quotes(path_to_string(*c.state_dict)) + " and the tensor at " +
                                           text::in_quotes(path_to_string(c.tensors[t].path)) +
                                           " (outside the state dict); ckptool does not pick one of them")
            .with_file(c.path);
      names.push_back(std::move(name));
      ids.push_back(t);
      record.push_back(true);
    }
  }
  // This name is a tensor record (by path), not a key: every name of a side without a
  // state dict, and the tensors beside one.
  bool is_record(size_t i) const { return !by_key || (i < record.size() && record[i]); }

  // The keys renamed for pairing by diff_options::edit_a; reports keep the checkpoint's names.
  void edit(const std::vector<key_op>& ops, diff_report& r) {
    if (ops.empty()) return;
    for (const key_op& op : ops) r.edits_a.push_back(op.describe());
    rekey_plan plan = plan_rekey(names, ops);
    if (!plan.emptied.empty())
      throw error(errc::usage, "the edits of A's keys leave " + text::in_quotes(plan.emptied.front()) + " empty")
          .with_file(c.path);
    if (!plan.collisions.empty()) {
      const auto& [to, from] = plan.collisions.front();
      throw error(errc::usage, "the edits of A's keys make " + std::to_string(from.size()) + " keys one, " +
                                   text::in_quotes(to) + ": " + text::join_names(from, 4))
          .with_file(c.path);
    }
    r.unused_edits_a = std::move(plan.unused_ops);
    labels = std::move(names);
    names.clear();
    names.reserve(plan.mapping.size());
    for (auto& [from, to] : plan.mapping) names.push_back(std::move(to));
  }
  const std::string& label(size_t i) const { return labels.empty() ? names[i] : labels[i]; }

  // The record whose bits (conj, neg) apply to name i's values; nullptr for an assembled key,
  // whose pieces plan_assembly has checked to have none.
  const tensor_record* record_of(size_t i) const {
    if (is_record(i)) return &c.tensors[ids[i]];
    if (assembled_of_key[ids[i]] >= 0) return nullptr;
    return &c.tensors[c.keys.tensor(ids[i])];
  }
  dtype type(size_t i) const { return !is_record(i) ? c.keys.type(ids[i], c.tensors) : c.tensors[ids[i]].type; }
  std::vector<int64_t> shape(size_t i) const {
    const dim_list& d = !is_record(i) ? c.keys.shape(ids[i], c.tensors) : c.tensors[ids[i]].shape;
    return std::vector<int64_t>(d.begin(), d.end());
  }
  detail::key_reader reader(size_t i) const {
    if (!is_record(i) && assembled_of_key[ids[i]] >= 0)
      return detail::key_reader(c, label(i), assembled, assembled.tensors[size_t(assembled_of_key[ids[i]])]);
    return detail::key_reader(c, label(i), !is_record(i) ? c.keys.tensor(ids[i]) : ids[i]);
  }
  std::vector<keyed_tensor> keyed(const std::vector<size_t>& which) const {
    std::vector<keyed_tensor> out;
    for (size_t i : which) out.push_back({names[i], type(i), shape(i)});
    return out;
  }
};

// diff compares stored elements. A tensor's conjugate and negative bits (x.conj(),
// x.conj().imag) change what they mean: the same bits on both sides change both alike (the
// error's magnitude is that of the stored values), different bits cannot be judged on bytes.
void check_same_bits(const tensor_record* a, const tensor_record* b, const std::string& name) {
  const bool conj_a = a && a->conj, conj_b = b && b->conj, neg_a = a && a->neg, neg_b = b && b->neg;
  if (conj_a == conj_b && neg_a == neg_b) return;
  auto bits = [](bool conj, bool neg) {
    return conj && neg ? std::string("the conjugate and negative bits") : conj ? std::string("the conjugate bit")
                       : neg ? std::string("the negative bit") : std::string("neither bit");
  };
  throw error(errc::unsupported, "tensor " + text::in_quotes(name) + ": A's has " + bits(conj_a, neg_a) + " set, B's " +
                                     bits(conj_b, neg_b) + " (x.conj(), x.conj().imag); diff compares stored "
                                     "elements, which then mean different values (torch: x.resolve_conj().resolve_neg())");
}

// rekey --match names a full pairing's edit by the segments it removes or adds; a partial
// one (keys left over on both sides) is named the same way from its pairs.
std::string describe_edit(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::set<std::string> removed, added;
  for (const auto& [ka, kb] : pairs) {
    const auto sa = split_key(ka), sb = split_key(kb);
    for (auto x : sa)
      if (std::find(sb.begin(), sb.end(), x) == sb.end()) removed.insert(std::string(x) + ".");
    for (auto x : sb)
      if (std::find(sa.begin(), sa.end(), x) == sa.end()) added.insert(std::string(x) + ".");
  }
  std::string edit;
  for (const auto& x : removed) edit += (edit.empty() ? "" : ", ") + ("remove '" + x + "'");
  for (const auto& x : added) edit += (edit.empty() ? "" : ", ") + ("add '" + x + "'");
  return edit;
}

struct pair_of {
  size_t a, b;
};

// A torch.save file (one pickle) whose values DCP's flattening names: see dcp_name.
bool is_pickle_file(const checkpoint& c) {
  return c.layout == checkpoint_layout::single_file &&
         (c.format == file_format::torch_zip || c.format == file_format::torch_legacy);
}

// dcp.save(sd) stores the value at path (k1, k2, ...) of sd under the key "k1.k2...", each
// element str()'d (flatten_state_dict, docs/formats.md §12.4), and dcp.load(sd) fills that
// place from that key: a torch.save of the same sd holds it at the same path. For a key of
// the pickle's state dict, its path is the state dict's own path, then the key; a pickle
// without one names every tensor record by its path.
std::string dcp_name(const side& s, size_t i) {
  if (s.is_record(i)) return path_to_string(s.c.tensors[s.ids[i]].path, '.');
  const std::string root = s.c.state_dict ? path_to_string(*s.c.state_dict, '.') : std::string();
  return root.empty() ? s.names[i] : root + "." + s.names[i];
}

// A tensor inside a pickle side's entry paired with a key of its DCP twin: (the leaf in
// that side's entries, the key on the other side); `pickle_is_a` says which side is which.
struct entry_key_pair {
  size_t leaf, key;
};

// Pairs a torch.save file's keys, then the tensors inside its entries (an optimizer's
// exp_avg), with the keys of a DCP directory saved from the same dict (dcp_name), among
// the keys not paired by name: marks both sides' keys and the leaves it pairs.
void pair_dcp_twin(const side& p, const std::vector<detail::entry_leaf>& leaves, std::vector<bool>& p_hit,
                   const side& d, std::vector<bool>& d_hit, std::vector<bool>& leaf_used,
                   std::vector<pair_of>& key_pairs, std::vector<entry_key_pair>& entry_pairs) {
  std::unordered_map<std::string_view, size_t> in_d;
  for (size_t j = 0; j < d.names.size(); ++j)
    if (!d_hit[j]) in_d.emplace(d.names[j], j);
  auto take = [&](const std::string& name) -> std::optional<size_t> {
    auto it = in_d.find(name);
    if (it == in_d.end() || d_hit[it->second]) return std::nullopt;
    d_hit[it->second] = true;
    return it->second;
  };
  std::unordered_set<size_t> records;  // a pickle without a state dict: its paired records
  for (size_t i = 0; i < p.names.size(); ++i) {
    if (p_hit[i]) continue;
    if (std::optional<size_t> j = take(dcp_name(p, i))) {
      p_hit[i] = true;
      key_pairs.push_back({i, *j});
      if (p.is_record(i)) records.insert(p.ids[i]);
    }
  }
  // Such a pickle's entries hold the records it names: compared as keys, not leaves too.
  for (size_t l = 0; l < leaves.size(); ++l)
    if (leaves[l].tensor && records.count(*leaves[l].tensor)) leaf_used[l] = true;
  for (size_t l = 0; l < leaves.size(); ++l) {
    if (leaf_used[l]) continue;
    if (!leaves[l].tensor) continue;
    if (std::optional<size_t> j = take(leaves[l].dotted)) {
      leaf_used[l] = true;
      entry_pairs.push_back({l, *j});
    }
  }
}

// What pair_keys pairs besides keys: a pickle side's entry tensors with its DCP twin's keys.
struct twin_pairs {
  bool pickle_is_a = true;
  std::vector<entry_key_pair> pairs;
  std::vector<bool> leaf_used;  // of the pickle side's entry leaves
};

// Pairs by equal names, then a .pt's with its DCP twin's (pair_dcp_twin), then the rest
// through rekey --match's solver (a wrapper segment added or removed on one side). Fills
// r's only_in_* and renamed; returns the key pairs in A's order.
std::vector<pair_of> pair_keys(const side& a, const side& b, const std::vector<detail::entry_leaf>& leaves_a,
                               const std::vector<detail::entry_leaf>& leaves_b, diff_report& r, twin_pairs& twin) {
  std::unordered_map<std::string_view, size_t> in_b;
  for (size_t i = 0; i < b.names.size(); ++i) in_b.emplace(b.names[i], i);
  std::vector<pair_of> pairs;
  std::vector<bool> b_hit(b.names.size(), false);
  std::vector<size_t> rest_a, rest_b;
  std::vector<bool> a_hit(a.names.size(), false);
  for (size_t i = 0; i < a.names.size(); ++i) {
    auto it = in_b.find(a.names[i]);
    if (it == in_b.end() || b_hit[it->second]) continue;
    a_hit[i] = b_hit[it->second] = true;
    pairs.push_back({i, it->second});
  }
  const bool twins = (is_pickle_file(a.c) && b.c.layout == checkpoint_layout::dcp && b.by_key) ||
                     (is_pickle_file(b.c) && a.c.layout == checkpoint_layout::dcp && a.by_key);
  if (twins) {
    twin.pickle_is_a = is_pickle_file(a.c);
    std::vector<pair_of> found;
    if (twin.pickle_is_a) {
      twin.leaf_used.assign(leaves_a.size(), false);
      pair_dcp_twin(a, leaves_a, a_hit, b, b_hit, twin.leaf_used, found, twin.pairs);
      pairs.insert(pairs.end(), found.begin(), found.end());
    } else {
      twin.leaf_used.assign(leaves_b.size(), false);
      pair_dcp_twin(b, leaves_b, b_hit, a, a_hit, twin.leaf_used, found, twin.pairs);
      for (const pair_of& f : found) pairs.push_back({f.b, f.a});
    }
  }
  for (size_t i = 0; i < a.names.size(); ++i)
    if (!a_hit[i]) rest_a.push_back(i);
  for (size_t i = 0; i < b.names.size(); ++i)
    if (!b_hit[i]) rest_b.push_back(i);
  if (!rest_a.empty() && !rest_b.empty()) {
    const match_result m = match_keys(a.keyed(rest_a), b.keyed(rest_b));
    // An ambiguous reduction pairs nothing: two keys that reduce alike are left unpaired.
    if (m.ambiguity.empty() && !m.mapping.empty()) {
      std::unordered_map<std::string_view, size_t> a_of, b_of;
      for (size_t i : rest_a) a_of.emplace(a.names[i], i);
      for (size_t i : rest_b) b_of.emplace(b.names[i], i);
      std::vector<bool> a_paired(a.names.size(), false);
      std::vector<std::pair<std::string, std::string>> by_name;  // as paired: A's keys edited
      for (const auto& [ka, kb] : m.mapping) {
        const size_t ia = a_of.at(ka), ib = b_of.at(kb);
        pairs.push_back({ia, ib});
        a_paired[ia] = b_hit[ib] = true;
        by_name.emplace_back(ka, kb);
        r.renamed.emplace_back(a.label(ia), b.label(ib));
      }
      r.rename_edit = m.ok ? m.edit : describe_edit(by_name);
      rest_a.erase(std::remove_if(rest_a.begin(), rest_a.end(), [&](size_t i) { return a_paired[i]; }), rest_a.end());
      rest_b.erase(std::remove_if(rest_b.begin(), rest_b.end(), [&](size_t i) { return b_hit[i]; }), rest_b.end());
    }
  }
  for (size_t i : rest_a) r.only_in_a.push_back(a.label(i));
  for (size_t i : rest_b) r.only_in_b.push_back(b.label(i));
  std::sort(pairs.begin(), pairs.end(), [](const pair_of& x, const pair_of& y) { return x.a < y.a; });
  return pairs;
}

// What diff compares besides the state dict: the entries' leaves, and the safetensors
// __metadata__ maps (compared only when both sides are safetensors: no other format has one).
struct side_values {
  std::vector<detail::entry_leaf> entries, metadata;
};

side_values values_of(const checkpoint& c, const diff_options& o, const detail::walked_values* walked = nullptr) {
  side_values v;
  if (!o.ignore_entries) v.entries = detail::entry_leaves(c, walked);
  if (!o.ignore_metadata) v.metadata = detail::metadata_leaves(c);
  return v;
}

entry_value shown(const detail::entry_leaf& l) { return {l.type, l.shown}; }

// A tensor inside an entry on both sides: (A's record, B's record, path).
struct entry_tensor_pair {
  size_t a, b;
  std::string path;
};

// Where a leaf is: its path and what each element of it is. A DCP directory keeps no dict
// key's type (its planner str()s every key, §12.4): against one, a key is its text.
std::string place_of(const detail::entry_leaf& l, bool key_types) {
  std::string kinds = l.kinds;
  if (!key_types) std::replace(kinds.begin(), kinds.end(), 'k', 's');
  return l.path + '\0' + kinds;
}

// A leaf whose path the other side has, at a place of another kind: its type, and which.
entry_value shown_at(const detail::entry_leaf& l, const detail::entry_leaf& other) {
  static const char* const kWords[] = {"a str key", "a key that is no str", "an index", "an object's part"};
  auto word = [](char k) { return kWords[k == 's' ? 0 : k == 'k' ? 1 : k == 'n' ? 2 : 3]; };
  size_t i = 0;
  while (i < l.kinds.size() && i < other.kinds.size() && l.kinds[i] == other.kinds[i]) ++i;
  if (i == l.kinds.size()) return shown(l);
  return {l.type + " (path element " + std::to_string(i + 1) + " is " + word(l.kinds[i]) + ")", l.shown};
}

// `values`: tensor values are compared, so a tensor leaf equal on both sides but without a
// record to read (a value summarized, not walked) cannot be called equal. `key_types`:
// both sides keep dict keys' types (neither is a DCP directory).
void compare_leaves(const std::vector<detail::entry_leaf>& a, const std::vector<detail::entry_leaf>& b,
                    diff_report& r, std::vector<entry_tensor_pair>* tensors, bool values, bool key_types) {
  std::unordered_map<std::string, size_t> in_b;
  std::unordered_multimap<std::string_view, size_t> b_by_path;
  for (size_t i = 0; i < b.size(); ++i) {
    in_b.emplace(place_of(b[i], key_types), i);
    b_by_path.emplace(b[i].path, i);
  }
  std::vector<bool> b_seen(b.size(), false);
  std::vector<const detail::entry_leaf*> a_alone;
  for (const detail::entry_leaf& la : a) {
    auto it = in_b.find(place_of(la, key_types));
    if (it == in_b.end() || b_seen[it->second]) {
      a_alone.push_back(&la);
      continue;
    }
    b_seen[it->second] = true;
    const detail::entry_leaf& lb = b[it->second];
    if (tensors && la.tensor && lb.tensor) {
      tensors->push_back({*la.tensor, *lb.tensor, la.path});  // dtype, shape and values as tensors
    } else if (la.type != lb.type || la.exact != lb.exact) {
      r.entries.push_back({la.path, shown(la), shown(lb)});
    } else if (values && (la.unread_tensor || lb.unread_tensor)) {
      throw error(errc::unsupported, "entry '" + la.path + "' holds tensors whose values diff cannot read; " +
                                         "--metadata-only or --ignore-entries compare without them")
          .with_file(la.unread_tensor ? r.path_a : r.path_b);
    } else if (la.partial || lb.partial) {
      ++r.entries_elided;
    }
  }
  // The same path at places of other kinds ({0: x} against {"0": x}, or [x]): one
  // difference, saying which element differs; else a leaf on one side only.
  for (const detail::entry_leaf* la : a_alone) {
    std::optional<size_t> twin;
    for (auto [it, end] = b_by_path.equal_range(la->path); it != end && !twin; ++it)
      if (!b_seen[it->second]) twin = it->second;
    if (!twin) {
      r.entries.push_back({la->path, shown(*la), std::nullopt});
      continue;
    }
    b_seen[*twin] = true;
    r.entries.push_back({la->path, shown_at(*la, b[*twin]), shown_at(b[*twin], *la)});
  }
  for (size_t i = 0; i < b.size(); ++i)
    if (!b_seen[i]) r.entries.push_back({b[i].path, std::nullopt, shown(b[i])});
}

}  // namespace

const char* verdict_name(value_verdict v) {
  switch (v) {
    case value_verdict::identical: return "identical";
    case value_verdict::equal: return "equal";
    case value_verdict::close: return "close";
    case value_verdict::different: return "different";
    case value_verdict::not_compared: return "not-compared";
  }
  return "not-compared";
}

bool tensor_diff::equivalent() const {
  return !dtype_differs() && !shape_differs() &&
         (values == value_verdict::identical || values == value_verdict::equal || values == value_verdict::close);
}

bool diff_report::equivalent() const {
  if (!only_in_a.empty() || !only_in_b.empty() || !renamed.empty() || !entries.empty()) return false;
  for (const tensor_diff& t : tensors) {
    if (t.dtype_differs() || t.shape_differs()) return false;
    if (!metadata_only && !t.equivalent()) return false;
  }
  return true;
}

namespace {

// Where a compared tensor's bytes are: a state-dict key of a side, or a tensor record
// inside an entry.
struct reader_ref {
  const side* s;
  size_t i;
  bool record;
  detail::key_reader make(const std::string& name) const {
    return record ? detail::key_reader(s->c, name, i) : s->reader(i);
  }
};

diff_report diff_with(const checkpoint& ca, const checkpoint& cb, const side_values& va, const side_values& vb,
                      const diff_options& o) {
  diff_report r;
  r.path_a = ca.path;
  r.path_b = cb.path;
  r.format_a = format_name(ca.format);
  r.format_b = format_name(cb.format);
  r.layout_a = layout_name(ca.layout);
  r.layout_b = layout_name(cb.layout);
  r.metadata_only = o.metadata_only;
  side a(ca);
  const side b(cb);
  a.edit(o.edit_a, r);
  r.keys_a = a.names.size();
  r.keys_b = b.names.size();
  std::vector<std::pair<reader_ref, reader_ref>> refs;
  twin_pairs twin;
  for (const pair_of& p : pair_keys(a, b, va.entries, vb.entries, r, twin)) {
    tensor_diff d;
    d.key_a = a.label(p.a);
    d.key_b = b.label(p.b);
    d.type_a = a.type(p.a);
    d.type_b = b.type(p.b);
    d.shape_a = a.shape(p.a);
    d.shape_b = b.shape(p.b);
    if (!o.metadata_only) check_same_bits(a.record_of(p.a), b.record_of(p.b), d.key_a);
    r.tensors.push_back(std::move(d));
    refs.push_back({{&a, p.a, false}, {&b, p.b, false}});
  }
  // A side without a state dict already compares every tensor record by its path; its
  // entries' tensors are then compared as leaves (dtype and shape) only.
  // A .pt's entry tensors paired with its DCP twin's keys are tensors, no longer leaves.
  std::vector<detail::entry_leaf> twin_rest;
  const bool twin_leaves = std::find(twin.leaf_used.begin(), twin.leaf_used.end(), true) != twin.leaf_used.end();
  if (twin_leaves) {
    const std::vector<detail::entry_leaf>& all = twin.pickle_is_a ? va.entries : vb.entries;
    for (size_t l = 0; l < all.size(); ++l)
      if (!twin.leaf_used[l]) twin_rest.push_back(all[l]);
  }
  const bool twin_a = twin_leaves && twin.pickle_is_a, twin_b = twin_leaves && !twin.pickle_is_a;
  std::vector<entry_tensor_pair> entry_tensors;
  const bool key_types = ca.layout != checkpoint_layout::dcp && cb.layout != checkpoint_layout::dcp;
  compare_leaves(twin_a ? twin_rest : va.entries, twin_b ? twin_rest : vb.entries, r,
                 a.by_key && b.by_key ? &entry_tensors : nullptr, !o.metadata_only, key_types);
  // Only two sides that can both hold such metadata: a .pt has no __metadata__, a single
  // file no index.
  const bool both_st = ca.format == file_format::safetensors && cb.format == file_format::safetensors;
  const bool both_sets = ca.layout == checkpoint_layout::hf_shard_set && cb.layout == checkpoint_layout::hf_shard_set;
  auto kept = [&](const std::vector<detail::entry_leaf>& all) {
    std::vector<detail::entry_leaf> out;
    for (const detail::entry_leaf& l : all)
      if (l.path.compare(0, 6, "index/") == 0 ? both_sets : both_st) out.push_back(l);
    return out;
  };
  compare_leaves(kept(va.metadata), kept(vb.metadata), r, nullptr, false, true);
  for (const entry_tensor_pair& p : entry_tensors) {
    const tensor_record& ta = ca.tensors[p.a];
    const tensor_record& tb = cb.tensors[p.b];
    if (!o.metadata_only) check_same_bits(&ta, &tb, p.path);
    tensor_diff d;
    d.key_a = d.key_b = p.path;
    d.type_a = ta.type;
    d.type_b = tb.type;
    d.shape_a.assign(ta.shape.begin(), ta.shape.end());
    d.shape_b.assign(tb.shape.begin(), tb.shape.end());
    r.tensors.push_back(std::move(d));
    refs.push_back({{&a, p.a, true}, {&b, p.b, true}});
  }
  for (const entry_key_pair& p : twin.pairs) {
    const side& ps = twin.pickle_is_a ? a : b;
    const side& ds = twin.pickle_is_a ? b : a;
    const detail::entry_leaf& leaf = (twin.pickle_is_a ? va.entries : vb.entries)[p.leaf];
    const tensor_record& t = ps.c.tensors[*leaf.tensor];
    // Filled as if the pickle were A, then turned round if it is B.
    tensor_diff d;
    d.key_a = leaf.path;
    d.key_b = ds.label(p.key);
    d.type_a = t.type;
    d.type_b = ds.type(p.key);
    d.shape_a.assign(t.shape.begin(), t.shape.end());
    d.shape_b = ds.shape(p.key);
    std::pair<reader_ref, reader_ref> ref{{&ps, *leaf.tensor, true}, {&ds, p.key, false}};
    if (!o.metadata_only) check_same_bits(&t, ds.record_of(p.key), leaf.path);
    if (!twin.pickle_is_a) {
      std::swap(d.key_a, d.key_b);
      std::swap(d.type_a, d.type_b);
      std::swap(d.shape_a, d.shape_b);
      std::swap(ref.first, ref.second);
    }
    r.tensors.push_back(std::move(d));
    refs.push_back(ref);
  }

  uint64_t total = 0;
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    tensor_diff& d = r.tensors[i];
    if (!o.metadata_only && !d.shape_differs()) {
      // Every pair's readers are made before any byte is read: data ckptool cannot read
      // exactly is refused before a long comparison, not after it.
      const detail::key_reader ra = refs[i].first.make(d.key_a), rb = refs[i].second.make(d.key_b);
      total += ra.nbytes() + rb.nbytes();
    } else {
      d.not_compared_reason = o.metadata_only ? "--metadata-only" : "shapes differ";
    }
  }
  if (o.metadata_only) return r;

  detail::compare_buffers buffers;
  uint64_t done = 0;
  auto progress = [&](uint64_t n) {
    done += n;
    if (o.progress) o.progress(done, total);
  };
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    tensor_diff& d = r.tensors[i];
    if (d.shape_differs()) continue;
    detail::key_reader ra = refs[i].first.make(d.key_a), rb = refs[i].second.make(d.key_b);
    detail::compare_values(ra, rb, o, buffers, d, progress);
  }
  r.bytes_compared = done;
  return r;
}

}  // namespace

diff_report diff_checkpoints(const checkpoint& a, const checkpoint& b, const diff_options& o) {
  return diff_with(a, b, values_of(a, o), values_of(b, o), o);
}

diff_report diff_checkpoints(const std::string& pa, const std::string& pb, const diff_options& o,
                             const open_options& given) {
  // One side open at a time would halve metadata memory, but pairing needs both key lists;
  // the pickle trees, most of that memory, are dropped as soon as each side's entries are
  // walked (values decoded from pickles of their own are walked while open reads them).
  auto open_side = [&](const std::string& path, side_values& values) {
    detail::walked_values walked(path);
    open_options reader = given;
    if (!o.ignore_entries) {
      reader.entry_value_seen = [&walked](const value_path& p, const pickle::value& v,
                                          const std::vector<entry_tensor>& tensors) { walked.seen(p, v, tensors); };
      // Their values are compared as any tensor's: the records must outlive the pickles.
      reader.keep_entry_tensors = true;
    }
    checkpoint c = open_checkpoint(path, reader);
    values = values_of(c, o, &walked);
    release_pickle(c);
    return c;
  };
  side_values va, vb;
  checkpoint a = open_side(pa, va);
  checkpoint b = open_side(pb, vb);
  return diff_with(a, b, va, vb, o);
}

}  // namespace ckpt
