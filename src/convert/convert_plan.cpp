// plan_convert: which tensors a conversion writes, under which names, and what it refuses
// or drops (formats.md §13.1). Everything here reads metadata only.

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <unordered_set>

#include "base/glob.h"
#include "ckpt/convert.h"
#include "ckpt/dcp.h"
#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "base/text.h"
#include "formats/safetensors_writer.h"
#include "model/beside_state_dict.h"
#include "model/assembly.h"
#include "model/plain_tensor.h"
#include "model/row_major.h"
#include "pickle/pickle_accessors.h"

namespace ckpt {
namespace {

// "'a', 'b', 'c' and 2 more": the first few of a list, for a one-line message.
std::string listed(const std::vector<std::string>& names, size_t shown = 5) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < shown; ++i) out += (i ? ", " : "") + text::quote(names[i], 80);
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

// One key of the state dict to convert, before the edits.
struct source_key {
  std::string key;
  std::optional<size_t> record;     // c.tensors
  std::optional<size_t> assembled;  // c.keys
};

// The keys of the state dict open_checkpoint found (checkpoint::keys).
std::vector<source_key> found_keys(const checkpoint& c) {
  std::vector<source_key> out;
  out.reserve(c.keys.size());
  for (size_t k = 0; k < c.keys.size(); ++k) {
    source_key s;
    s.key = std::string(c.keys.key(k));
    if (detail::is_assembled(c.keys, k))
      s.assembled = k;
    else
      s.record = c.keys.tensor(k);
    out.push_back(std::move(s));
  }
  return out;
}

// --state-dict PATH: the tensors (and second names of tensors) one string key below PATH.
std::vector<source_key> keys_below(const checkpoint& c, const value_path& root) {
  auto below = [&root](const value_path& p) -> const std::string* {
    if (p.size() != root.size() + 1 || !std::equal(root.begin(), root.end(), p.begin())) return nullptr;
    return std::get_if<std::string>(&p.back());
  };
  std::vector<source_key> out;
  for (size_t i = 0; i < c.tensors.size(); ++i)
    if (const std::string* k = below(c.tensors[i].path)) out.push_back({*k, i, std::nullopt});
  for (const tensor_alias& a : c.aliases)
    if (const std::string* k = below(a.path)) out.push_back({*k, a.tensor, std::nullopt});
  if (out.empty())
    throw error(errc::usage, "--state-dict " + text::quote(path_to_string(root)) + " holds no tensor keyed by name")
        .with_file(c.path);
  return out;
}

// Refuses a record whose values the writers cannot reproduce exactly as a plain tensor.
void check_record(const checkpoint& c, const tensor_record& t, const std::string& key, convert_target to) {
  if (const auto why = detail::not_plain_reason(c, t))
    throw error(errc::unsupported, "tensor " + text::quote(key) + " " + *why + ": convert writes plain tensors only")
        .with_file(c.path);
}

uint64_t contiguous_bytes(dtype type, const std::vector<int64_t>& shape) {
  uint64_t n = element_size(type);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

// --to dcp from a DCP directory with one `.metadata`: its BYTE_IO items can be copied as
// they are, since a DCP directory holds them the same way. Not with key edits, --select or
// --state-dict (a value may name keys, as an optimizer's param_groups do, and is not
// re-encoded: rekey the output, which checks them), nor with unsafe globals (which item
// names them is not kept). Not from rank-local metadata (§9.8), whose items are per rank.
void carry_byte_items(const checkpoint& c, const convert_request& r, convert_plan& plan) {
  if (r.to != convert_target::dcp || c.layout != checkpoint_layout::dcp || !r.ops.empty() || !r.select.empty() ||
      r.state_dict || !c.unsafe_globals.empty() || c.entries.empty())
    return;
  const std::string& index = c.index_path;
  const size_t slash = index.rfind('/');
  const std::string base = slash == std::string::npos ? index : index.substr(slash + 1);
  if (base != ".metadata") return;
  const std::string dir = slash == std::string::npos ? std::string() : index.substr(0, slash + 1);
  dcp::metadata md;
  try {
    md = dcp::decode_metadata(file_source(index));
  } catch (error& e) {
    e.with_file(index);
    throw;
  }
  for (const dcp::item& it : md.items) {
    if (it.is_tensor) continue;
    convert_byte_item b;
    b.name = it.fqn;
    b.path = {it.fqn};
    for (const auto& p : md.planner_data)
      if (p.fqn == it.fqn) {
        b.path.clear();
        for (const auto& e : p.path) b.path.push_back(e.is_index ? path_element(e.index) : path_element(e.key));
      }
    const dcp::storage_item* s = nullptr;
    for (const auto& x : md.storage_data)
      if (x.fqn == it.fqn && !x.offsets) s = &x;
    if (!s) throw error(errc::corrupt, "BYTE_IO item '" + it.fqn + "' has no storage entry").with_file(index);
    size_t f = c.files.size();
    for (size_t i = 0; i < c.files.size(); ++i)
      if (!c.files[i].within && c.files[i].path == dir + s->relative_path) f = i;
    if (f == c.files.size())
      throw error(errc::corrupt, "BYTE_IO item '" + it.fqn + "': its file " + s->relative_path + " is not open")
          .with_file(index);
    if (s->offset > c.files[f].size || s->length > c.files[f].size - s->offset)
      throw error(errc::corrupt, "BYTE_IO item '" + it.fqn + "' reaches past the end of its file", s->offset)
          .with_file(c.files[f].path);
    b.file = f;
    b.offset = s->offset;
    b.length = s->length;
    b.transforms = s->transform_descriptors;
    plan.byte_items.push_back(std::move(b));
  }
}

bool is_prefix(const value_path& prefix, const value_path& path) {
  return prefix.size() <= path.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

// --state-dict P below entry `e` (e is P or holds it): what is left out of e is what lies
// beside the way down to P, and P's own values that are not tensors. The model lists
// top-level entries only, so those are found in e's value.
void left_out_around(const entry_summary& e, const value_path& state_dict,
                     const std::unordered_set<std::string>& keys, std::vector<std::string>& other) {
  const pickle::value* v = e.node;
  value_path at = e.path;
  for (size_t depth = e.path.size();; ++depth) {
    if (!v || v->type != pickle::kind::dict) {
      // Not a dict the way down (or a value decoded elsewhere): named whole, with what was taken.
      other.push_back(path_to_string(at) + " (" + (v ? detail::python_type_of(v) : e.type) + ", all but " +
                      path_to_string(state_dict) + ")");
      return;
    }
    const pickle::value* next = nullptr;
    for (size_t i = 0; i < v->dict_size(); ++i) {
      const pickle::value* k = v->dict_key(i);
      const pickle::value* x = v->dict_value(i);
      const bool str = k->type == pickle::kind::str;
      if (depth < state_dict.size() && str && path_element(k->text) == state_dict[depth]) {
        next = x;
        continue;
      }
      if (depth == state_dict.size() && str && keys.count(k->text)) continue;
      value_path p = at;
      if (k->type == pickle::kind::integer)
        p.emplace_back(k->integer);
      else
        p.emplace_back(str ? k->text : pickle::repr(k, 80));
      other.push_back(path_to_string(p) + " (" + detail::python_type_of(x) + ")");
    }
    if (depth == state_dict.size()) return;
    at.push_back(state_dict[depth]);
    v = next;
  }
}

// The entries the output cannot hold, unless the request says to drop them.
// `state_dict_keys`: with --state-dict, every key below it, selected or not.
void check_other_entries(const checkpoint& c, const convert_request& r,
                         const std::unordered_set<std::string>& state_dict_keys, convert_plan& plan) {
  std::vector<std::string> other;
  for (const entry_summary& e : c.entries) {
    const bool carried = std::any_of(plan.byte_items.begin(), plan.byte_items.end(),
                                     [&](const convert_byte_item& b) { return b.path == e.path; });
    if (carried) continue;
    if (r.state_dict && is_prefix(e.path, *r.state_dict))
      left_out_around(e, *r.state_dict, state_dict_keys, other);
    else
      other.push_back(path_to_string(e.path) + " (" + e.type + ")");
  }
  // Tensors beside a state dict below the root are no entries, but are left out all the same.
  for (size_t t : detail::tensors_beside_state_dict(c))
    other.push_back(path_to_string(c.tensors[t].path) + " (tensor)");
  if (c.pt2) {
    // A torch.export archive's constants (lifted tensors, non-persistent buffers) are no
    // state-dict keys; its pickled tensors and script objects are not read at all.
    for (const tensor_record& t : c.tensors)
      if (std::find(t.path.begin(), t.path.end(), path_element(std::string("<constants>"))) != t.path.end())
        other.push_back(path_to_string(t.path) + " (constant)");
    for (const pt2::model& m : c.pt2->models)
      for (const pt2::opaque_entry& e : m.opaque) other.push_back(m.key_prefix + e.fqn + " (" + e.what + ")");
  }
  if (!c.unsafe_globals.empty()) {
    if (!r.drop_other)
      throw error(errc::unsafe, "names globals torch.load(weights_only=True) refuses: " + listed(c.unsafe_globals) +
                                    "; pass --drop-other to convert the state dict's tensors without them")
          .with_file(c.path);
    for (const auto& g : c.unsafe_globals) plan.dropped.push_back("unsafe global " + g);
  }
  // A torch file could hold the state dict's _metadata (module versions, which
  // load_state_dict passes to each module's _load_from_state_dict), but convert writes a
  // plain dict of tensors: said, never refused (rekey keeps it). safetensors and DCP have
  // no place for it, as for every writer of theirs.
  if (r.to == convert_target::torch && c.state_dict_node && (!r.state_dict || *r.state_dict == *c.state_dict) &&
      c.state_dict_node->type == pickle::kind::dict && c.state_dict_node->state &&
      detail::str_key(c.state_dict_node->state, "_metadata"))
    plan.dropped.push_back(path_to_string(*c.state_dict) + (c.state_dict->empty() ? "" : "/") +
                           "_metadata (module versions; rekey keeps them)");
  // --state-dict and --select name what is converted: everything else is left on purpose.
  if (other.empty()) return;
  if (r.drop_other || r.state_dict || !r.select.empty()) {
    plan.dropped.insert(plan.dropped.end(), other.begin(), other.end());
    return;
  }
  throw error(errc::unsupported, std::to_string(other.size()) + " entr" + (other.size() == 1 ? "y" : "ies") +
                                     " besides the state dict's tensors, which the output cannot hold: " +
                                     listed(other) + "; pass --drop-other (or --state-dict / --select) to leave them out")
      .with_file(c.path);
}

void choose_metadata(const checkpoint& c, const convert_request& r, convert_plan& plan) {
  const bool from_safetensors = c.format == file_format::safetensors;
  std::vector<std::pair<std::string, std::string>> user;
  if (from_safetensors && c.files.front().st_header) user = c.files.front().st_header->metadata;
  // A shard set's shards each have a __metadata__: what they all hold alike is the set's;
  // a pair some shard lacks or holds otherwise is not carried as if it were the set's, nor
  // dropped unsaid (it was only the first shard's that was read).
  if (from_safetensors && c.layout == checkpoint_layout::hf_shard_set) {
    using pairs = std::vector<std::pair<std::string, std::string>>;
    auto holds = [](const pairs& m, const std::pair<std::string, std::string>& kv) {
      return std::find(m.begin(), m.end(), kv) != m.end();
    };
    std::vector<std::string> uneven;
    pairs common = user;
    for (size_t f = 1; f < c.files.size(); ++f) {
      if (!c.files[f].st_header) continue;
      const pairs& theirs = c.files[f].st_header->metadata;
      for (const auto& kv : theirs)
        if (!holds(user, kv)) uneven.push_back("__metadata__ " + kv.first + " of " + c.files[f].path);
      for (const auto& kv : user)
        if (!holds(theirs, kv)) uneven.push_back("__metadata__ " + kv.first + " of " + c.files.front().path);
      common.erase(std::remove_if(common.begin(), common.end(), [&](const auto& kv) { return !holds(theirs, kv); }),
                   common.end());
    }
    if (!uneven.empty()) {
      std::sort(uneven.begin(), uneven.end());
      uneven.erase(std::unique(uneven.begin(), uneven.end()), uneven.end());
      if (!r.drop_other)
        throw error(errc::unsupported, "the shards' safetensors metadata differ: " + listed(uneven) +
                                           " (not held alike by every shard); pass --drop-other to carry only what "
                                           "every shard holds")
            .with_file(c.path);
      plan.dropped.insert(plan.dropped.end(), uneven.begin(), uneven.end());
      user = std::move(common);
    }
  }
  // HuggingFaceStorageWriter pieces (formats.md §9.10): DCP_SHARDING_INFO places the first
  // file's boxes, DCP_VERSION dates that map; neither describes the whole tensors written,
  // and a reader honouring the map would misplace them. Not carried, and not "lost" either.
  if (c.layout == checkpoint_layout::dcp && from_safetensors)
    user.erase(std::remove_if(user.begin(), user.end(),
                              [](const auto& kv) { return kv.first == "DCP_SHARDING_INFO" || kv.first == "DCP_VERSION"; }),
               user.end());
  if (r.to == convert_target::torch || r.to == convert_target::dcp) {
    // A torch.save file (or DCP directory) has no place for it: what says more than
    // "format: pt" is dropped.
    std::vector<std::string> lost;
    for (const auto& [k, v] : user)
      if (k != "format") lost.push_back("__metadata__ " + k);
    if (lost.empty()) return;
    if (!r.drop_other)
      throw error(errc::unsupported, std::string(r.to == convert_target::dcp ? "a DCP directory" : "a torch.save file") +
                                         " has no place for safetensors metadata " + listed(lost) +
                                         "; pass --drop-other to leave it out")
          .with_file(c.path);
    plan.dropped.insert(plan.dropped.end(), lost.begin(), lost.end());
    return;
  }
  plan.from_safetensors = from_safetensors;
  plan.metadata = std::move(user);
}

// A safetensors file holds a tie once, under the name that sorts first, the others
// recorded as __metadata__[alias] = kept: huggingface_hub's and safetensors'
// _remove_duplicate_names (sorted(complete_names)[0]), groups in the order their first
// key comes, each group's aliases sorted. (torch keeps every name, on one object.)
void keep_first_sorted_names(convert_plan& plan) {
  std::map<size_t, std::vector<size_t>> groups;  // first key's index -> every key of the tie
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    if (const auto first = plan.tensors[i].tie_of) {
      auto& g = groups[*first];
      if (g.empty()) g.push_back(*first);
      g.push_back(i);
    }
  for (auto& [first, keys] : groups) {
    std::sort(keys.begin(), keys.end(),
              [&](size_t a, size_t b) { return plan.tensors[a].name < plan.tensors[b].name; });
    const size_t kept = keys.front();
    plan.tensors[kept].tie_of.reset();
    for (size_t k = 1; k < keys.size(); ++k) {
      convert_tensor& alias = plan.tensors[keys[k]];
      alias.tie_of = kept;
      plan.ties.emplace_back(alias.name, plan.tensors[kept].name);
      // As save_model: the user's own metadata under that name wins.
      if (std::none_of(plan.metadata.begin(), plan.metadata.end(),
                       [&](const auto& kv) { return kv.first == alias.name; }))
        plan.metadata.emplace_back(alias.name, plan.tensors[kept].name);
    }
  }
}

}  // namespace

std::optional<convert_target> convert_target_named(const std::string& name) {
  if (name == "torch") return convert_target::torch;
  if (name == "safetensors") return convert_target::safetensors;
  if (name == "hf") return convert_target::hf;
  if (name == "dcp") return convert_target::dcp;
  return std::nullopt;
}

value_path state_dict_path_named(const checkpoint& c, const std::string& text) {
  std::vector<value_path> named;
  auto consider = [&](const value_path& p) {
    if (p.empty()) return;
    const value_path parent(p.begin(), p.end() - 1);
    if (parent.empty() || !std::all_of(parent.begin(), parent.end(),
                                       [](const path_element& e) { return std::holds_alternative<std::string>(e); }))
      return;
    if (path_to_string(parent) == text && std::find(named.begin(), named.end(), parent) == named.end())
      named.push_back(parent);
  };
  for (const tensor_record& t : c.tensors) consider(t.path);
  for (const tensor_alias& a : c.aliases) consider(a.path);
  if (named.size() > 1) {
    auto shown = [](const value_path& p) {
      std::string out = "[";
      for (size_t i = 0; i < p.size(); ++i) out += (i ? ", " : "") + text::quote(std::get<std::string>(p[i]), 80);
      return out + "]";
    };
    throw error(errc::usage, "--state-dict " + text::quote(text) + " is ambiguous: it names two dicts of tensors, " +
                                 shown(named[0]) + " and " + shown(named[1]) + " (a key holds '/')")
        .with_file(c.path);
  }
  if (named.size() == 1) return named.front();
  value_path split;
  for (size_t start = 0;;) {
    const size_t slash = text.find('/', start);
    split.emplace_back(text.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) return split;
    start = slash + 1;
  }
}

convert_plan plan_convert(const checkpoint& c, const convert_request& r) {
  convert_plan plan;
  plan.to = r.to;
  if (c.format == file_format::torchscript)
    throw error(errc::unsupported, "a TorchScript archive's parameters are named by its code: convert reads "
                                   "state dicts (materialize can load the module)")
        .with_file(c.path);
  if (c.byteorder != "little")
    throw error(errc::unsupported, "a " + c.byteorder + "-endian checkpoint: convert copies bytes as they are and "
                                   "writes little-endian formats only")
        .with_file(c.path);
  if (r.cast_to && (!info(*r.cast_to).is_floating || !r.cast))
    throw error(errc::usage, std::string("--dtype ") + name(*r.cast_to) +
                                 (r.cast ? ": not a floating dtype" : ": no cast function given"));
  std::vector<source_key> keys;
  if (r.state_dict) {
    keys = keys_below(c, *r.state_dict);
  } else {
    if (!c.state_dict || c.keys.empty())
      throw error(errc::unsupported, "no state dict found to convert (inspect shows where the tensors are; "
                                     "--state-dict names one)")
          .with_file(c.path);
    keys = found_keys(c);
  }
  // What --state-dict leaves out is named against all its keys, selected or not.
  std::unordered_set<std::string> state_dict_keys;
  if (r.state_dict)
    for (const source_key& k : keys) state_dict_keys.insert(k.key);
  if (!r.select.empty()) {
    std::vector<source_key> chosen;
    std::vector<bool> used(r.select.size(), false);
    const std::vector<text::glob> globs(r.select.begin(), r.select.end());
    for (auto& k : keys) {
      bool any = false;
      for (size_t g = 0; g < globs.size(); ++g)
        if (globs[g].matches(k.key)) any = used[g] = true;
      if (any) chosen.push_back(std::move(k));
    }
    for (size_t g = 0; g < r.select.size(); ++g)
      if (!used[g])
        throw error(errc::usage, "--select " + text::quote(r.select[g]) + " matches no key").with_file(c.path);
    keys = std::move(chosen);
  }
  carry_byte_items(c, r, plan);
  check_other_entries(c, r, state_dict_keys, plan);
  choose_metadata(c, r, plan);

  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const auto& k : keys) names.push_back(k.key);
  plan.keys = plan_rekey(std::move(names), r.ops);
  if (!plan.keys.emptied.empty())
    throw error(errc::check_failed, "the key edits leave " + std::to_string(plan.keys.emptied.size()) +
                                        " key(s) empty; nothing written: " + listed(plan.keys.emptied))
        .with_file(c.path);
  if (!plan.keys.collisions.empty()) {
    std::vector<std::string> lines;
    for (const auto& [to, from] : plan.keys.collisions) lines.push_back(text::in_quotes(to) + " <- " + text::join_names(from, 4));
    throw error(errc::check_failed, std::to_string(lines.size()) +
                                        " new key(s) would be claimed by several keys; nothing written: " +
                                        text::join_names(lines, 5))
        .with_file(c.path);
  }

  // Two keys viewing the same bytes the same way hold one tensor: a tie.
  using view_id = std::tuple<size_t, int64_t, std::vector<int64_t>, std::vector<int64_t>, dtype>;
  std::map<view_id, size_t> first_of_view;
  std::vector<size_t> assembled;
  for (size_t i = 0; i < keys.size(); ++i) {
    convert_tensor t;
    t.source_key = keys[i].key;
    t.name = plan.keys.mapping[i].second;
    if (keys[i].assembled) {
      const size_t k = *keys[i].assembled;
      t.assembled = k;
      t.type = c.keys.type(k, c.tensors);
      t.shape = c.keys.shape(k, c.tensors);
      assembled.push_back(k);
    } else {
      const tensor_record& rec = c.tensors.at(*keys[i].record);
      check_record(c, rec, t.source_key, r.to);
      t.record = keys[i].record;
      t.type = rec.type;
      t.shape = rec.shape;
      const view_id id{*rec.storage, rec.storage_offset, rec.shape, detail::is_row_major(rec) ? std::vector<int64_t>{}
                                                                                      : std::vector<int64_t>(rec.stride),
                       rec.type};
      auto [it, fresh] = first_of_view.emplace(id, plan.tensors.size());
      if (!fresh && r.to != convert_target::dcp) t.tie_of = it->second;
    }
    t.source_type = t.type;
    if (r.cast_to && info(t.type).is_floating) t.type = *r.cast_to;
    const bool safetensors_file = r.to == convert_target::safetensors || r.to == convert_target::hf;
    if (safetensors_file && !safetensors::writable_dtype_name(t.type))
      throw error(errc::unsupported, "tensor " + text::quote(t.source_key) + ": safetensors has no dtype " +
                                         name(t.type))
          .with_file(c.path);
    t.nbytes = contiguous_bytes(t.type, t.shape);
    t.source_nbytes = contiguous_bytes(t.source_type, t.shape);
    plan.tensors.push_back(std::move(t));
  }
  if (r.to == convert_target::safetensors || r.to == convert_target::hf) keep_first_sorted_names(plan);
  for (const convert_tensor& t : plan.tensors)
    if (!t.tie_of) plan.data_bytes += t.nbytes;
  // Pieces that overlap, leave holes or lie outside their tensor are refused now, before
  // any output exists.
  if (!assembled.empty()) detail::plan_assembly(c, assembled);
  return plan;
}

}  // namespace ckpt
