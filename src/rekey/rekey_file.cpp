#include "ckpt/rekey_file.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "base/byteio.h"
#include "base/ordered_json.h"
#include "ckpt/error.h"
#include "ckpt/pickle_writer.h"
#include "ckpt/zip_writer.h"
#include "base/string_index.h"
#include "pickle/node_marks.h"
#include "pickle/pickle_accessors.h"
#include "rekey/rekey_pt2.h"
#include "rekey/pickle_lockstep.h"
#include "base/text.h"

namespace ckpt {
namespace {

// rekey rewrites one file as a whole; a checkpoint of several is refused where it starts.
source_file& only_file(checkpoint& c) { return c.single_file("rekey"); }
const source_file& only_file(const checkpoint& c) { return c.single_file("rekey"); }

using pickle::kind;
using pickle::value;
using renamer = std::function<std::string(const std::string&)>;

renamer from_ops(const std::vector<key_op>& ops) {
  return [&ops](const std::string& k) {
    std::string out = k;
    for (const auto& op : ops) out = apply_op(op, out);
    return out;
  };
}

std::vector<std::string> str_keys(const value* d) {
  std::vector<std::string> keys;
  keys.reserve(d->dict_size());
  for (size_t i = 0; i < d->dict_size(); ++i)
    if (d->dict_key(i)->type == kind::str) keys.push_back(d->dict_key(i)->text);
  return keys;
}

// How many places in the document refer to each of its nodes (0, 1, or 2 for "more"), by
// node id: a key node only this dict refers to can take its new name in place, where one
// the memo shares with other places must be replaced. For a million tensors a fresh node per
// key was a tenth of rekey's memory.
class reference_counts {
 public:
  explicit reference_counts(const pickle::document& doc) : doc_(doc), counts_(doc.node_count() + 1, 0) {
    bump(doc.root);
    for (const value& v : doc.nodes()) {
      for (const value* child : v.items) bump(child);
      bump(v.state);
    }
  }
  /// True unless `v` is one of the document's nodes and exactly one place refers to it.
  bool shared(const value* v) const { return !doc_.owns(v) || v->id >= counts_.size() || counts_[v->id] != 1; }

 private:
  void bump(const value* v) {
    if (doc_.owns(v) && v->id < counts_.size() && counts_[v->id] < 2) ++counts_[v->id];
  }
  const pickle::document& doc_;
  std::vector<uint8_t> counts_;
};

// The key nodes renamed where they are, by the offset of the opcode that made each: the
// written pickle is then checked against the input's opcode by opcode (pickle_lockstep.h)
// instead of being decoded again. State-dict keys by their index in the plan, whose names
// outlive the tree (8 bytes a key at rekey's peak), other keys with a copy of their name.
struct in_place_log {
  static constexpr uint64_t kNotLogged = ~uint64_t(0);
  std::vector<uint64_t> sd_offsets;          // offsets as value::offset gives them
  std::vector<detail::renamed_str> others;
  std::deque<std::string> texts;
  void add(size_t sd_index, uint64_t offset, std::string_view name) {
    if (sd_index != kNotLogged) {
      if (sd_offsets.size() <= sd_index) sd_offsets.resize(sd_index + 1, kNotLogged);
      sd_offsets[sd_index] = offset;
    } else {
      others.push_back({offset, texts.emplace_back(name)});
    }
  }
  /// Every rename, its text from the plan for a state-dict key.
  std::vector<detail::renamed_str> all(const rekey_plan& plan) const {
    std::vector<detail::renamed_str> out;
    out.reserve(sd_offsets.size() + others.size());
    for (size_t i = 0; i < sd_offsets.size(); ++i)
      if (sd_offsets[i] != kNotLogged) out.push_back({sd_offsets[i], plan.mapping[i].second});
    out.insert(out.end(), others.begin(), others.end());
    return out;
  }
};

// Renames the str keys of dict `d` in place: `f(i, key)` gives the new name of its i-th str
// key (as anything a std::string_view can look at). A key node that is shared (the memo may
// share it with other places in the pickle) is replaced by a new one; an unshared one is
// renamed where it is, which writes the same bytes. New text goes into the document's arena.
// When two keys meet (only possible for `_metadata`: the planner refuses collisions among
// state-dict keys, whose renaming the mirrors share), the later value wins in the earlier
// position, as consume_prefix_in_state_dict_if_present does; `may_collide` asks for that check.
// `log`, if given, records the keys renamed where they are; `sd` says `d` is the state
// dict, whose i-th str key the plan's i-th entry names; `borrow` that f's names outlive the
// tree, which then points at them instead of copying them into its arena (a million keys:
// 32 MB at rekey's peak).
template <class F>
size_t rename_keys_indexed(pickle::document& doc, const reference_counts& refs, value* d, F&& f, bool may_collide,
                           in_place_log* log = nullptr, bool sd = false, bool borrow = false) {
  if (!may_collide) {
    // Every pair stays where it is: keys are renamed or replaced in place, without a second
    // array of a million pairs.
    size_t changed = 0, str_index = 0;
    for (size_t i = 0; i < d->dict_size(); ++i) {
      value*& k = d->items[2 * i];
      if (k->type != kind::str) continue;
      const auto& renamed = f(str_index++, k->text.view());
      const std::string_view name = renamed;
      if (name == k->text) continue;
      ++changed;
      if (refs.shared(k))
        k = doc.make(kind::str, k->offset);
      else if (log)
        log->add(sd ? str_index - 1 : in_place_log::kNotLogged, k->offset, name);
      k->text.borrow(borrow ? name : doc.keep(name));
    }
    return changed;
  }
  std::vector<value*> items;
  items.reserve(d->items.size());
  // Views of node texts, which stay put for the document's lifetime.
  std::unordered_map<std::string_view, size_t> position;
  size_t changed = 0, str_index = 0;
  for (size_t i = 0; i < d->dict_size(); ++i) {
    value* k = d->dict_key(i);
    value* v = d->dict_value(i);
    if (k->type == kind::str) {
      const auto& renamed = f(str_index++, k->text.view());
      const std::string_view name = renamed;
      if (name != k->text) {
        ++changed;
        if (refs.shared(k))
          k = doc.make(kind::str, k->offset);
        else if (log)
          log->add(sd ? str_index - 1 : in_place_log::kNotLogged, k->offset, name);
        k->text.borrow(doc.keep(name));
      }
      if (may_collide) {
        auto [it, inserted] = position.emplace(k->text, items.size());
        if (!inserted) {
          items[it->second + 1] = v;
          continue;
        }
      }
    }
    items.push_back(k);
    items.push_back(v);
  }
  d->items = items;
  return changed;
}

size_t rename_keys(pickle::document& doc, const reference_counts& refs, value* d, const renamer& f, bool may_collide,
                   in_place_log* log = nullptr) {
  return rename_keys_indexed(
      doc, refs, d, [&f](size_t, std::string_view k) { return f(std::string(k)); }, may_collide, log);
}

// `_metadata` follows the keys (module_rules); wrappers that an edit adds get the entry
// nn.Module.state_dict() would give them, {'version': 1}, just before the module they wrap.
size_t rename_metadata(pickle::document& doc, const reference_counts& refs, value* meta, const module_rules& rules,
                       in_place_log* log) {
  const renamer module_path = [&](const std::string& p) { return map_module_path(rules, p); };
  size_t changed = rename_keys(doc, refs, meta, module_path, true, log);
  for (const auto& [wrapper, before] : added_wrapper_paths(rules)) {
    bool present = false;
    size_t position = meta->dict_size();
    for (size_t i = 0; i < meta->dict_size(); ++i) {
      const value* k = meta->dict_key(i);
      if (k->type != kind::str) continue;
      if (k->text == wrapper) present = true;
      if (k->text == before && position == meta->dict_size()) position = i;
    }
    if (present) continue;
    value* key = doc.make(kind::str, 0);
    key->text = wrapper;
    value* entry = doc.make(kind::dict, 0);
    value* version_key = doc.make(kind::str, 0);
    version_key->text = "version";
    value* version = doc.make(kind::integer, 0);
    version->integer = 1;
    entry->items = {version_key, version};
    meta->items.insert(meta->items.begin() + long(2 * position), {key, entry});
    ++changed;
  }
  return changed;
}

value* metadata_of(value* state_dict) {
  value* st = state_dict->state;
  if (!st || st->type != kind::dict) return nullptr;
  for (size_t i = 0; i < st->dict_size(); ++i)
    if (st->dict_key(i)->type == kind::str && st->dict_key(i)->text == "_metadata" &&
        st->dict_value(i)->type == kind::dict)
      return st->dict_value(i);
  return nullptr;
}

// An FQN-keyed optimizer state (torch.distributed.checkpoint.state_dict.get_state_dict):
// {"state": {fqn: ...}, "param_groups": [{"params": [fqn, ...], ...}]}. Its state is a
// mirror; the parameter names of its groups' "params" lists are the same names, and renamed
// with it, or the file would name each parameter one way in "state" and another in the
// groups. Returns, for each mirror that is such a "state", the "params" lists beside it.
std::vector<std::pair<value*, std::string>> optimizer_param_lists(
    pickle::document& doc, const std::vector<std::pair<value*, std::string>>& mirrors) {
  std::vector<std::pair<value*, std::string>> out;
  if (mirrors.empty()) return out;
  std::unordered_map<const value*, const std::string*> mirror_path;
  for (const auto& [d, path] : mirrors) mirror_path.emplace(d, &path);
  for (const value& v : doc.nodes()) {
    if (v.type != kind::dict) continue;
    const value* state = detail::str_key(&v, "state");
    value* groups = const_cast<value*>(detail::str_key(&v, "param_groups"));
    if (!state || !groups || groups->type != kind::list) continue;
    auto it = mirror_path.find(state);
    if (it == mirror_path.end()) continue;
    std::string at = *it->second;
    if (at.size() >= 5 && at.compare(at.size() - 5, 5, "state") == 0) at.erase(at.size() - 5);
    for (size_t g = 0; g < groups->items.size(); ++g) {
      value* params = const_cast<value*>(detail::str_key(groups->items[g], "params"));
      if (params && params->type == kind::list)
        out.emplace_back(params, at + "param_groups/" + std::to_string(g) + "/params");
    }
  }
  return out;
}

// Renames the str elements of `list` that are state-dict keys; a shared node (the memo
// shares a name between "state" and "params") is replaced, an unshared one renamed in place.
size_t rename_names_in_list(pickle::document& doc, const reference_counts& refs, value* list,
                            const std::function<bool(std::string_view)>& is_sd_key, const renamer& rename) {
  size_t changed = 0;
  for (value*& item : list->items) {
    if (!item || item->type != kind::str || !is_sd_key(item->text.view())) continue;
    const std::string name = rename(std::string(item->text.view()));
    if (name == item->text) continue;
    ++changed;
    if (refs.shared(item)) item = doc.make(kind::str, item->offset);
    item->text.borrow(doc.keep(name));
  }
  return changed;
}

// Other dicts keyed by the same names as the state dict (FQN-keyed optimizer state). A
// tensor's rebuild call is not entered: its arguments (storage, sizes, hooks) are no
// state-dict-keyed dicts, and a million of them are most of a big checkpoint's nodes.
class mirror_finder {
 public:
  mirror_finder(const std::function<bool(std::string_view)>& is_sd_key, const value* skip_a, const value* skip_b,
                const detail::node_marks& tensors, const pickle::document& doc)
      : is_sd_key_(is_sd_key), skip_a_(skip_a), skip_b_(skip_b), tensors_(tensors), seen_(doc) {}

  std::vector<std::pair<value*, std::string>> run(value* root) {
    find(root, 0);
    return std::move(out_);
  }

 private:
  void find(value* v, int depth) {
    if (!v || depth > 200) return;
    if (v->type != kind::dict && v->type != kind::list && v->type != kind::tuple && v->type != kind::object) return;
    if (tensors_.contains(v) || !seen_.insert(v)) return;
    switch (v->type) {
      case kind::dict: {
        if (v != skip_a_ && v != skip_b_ && v->dict_size() > 0) {
          bool mirror = true;
          for (size_t i = 0; i < v->dict_size() && mirror; ++i)
            mirror = v->dict_key(i)->type == kind::str && is_sd_key_(v->dict_key(i)->text);
          if (mirror) out_.emplace_back(v, path_);
        }
        for (size_t i = 0; i < v->dict_size(); ++i) {
          const value* k = v->dict_key(i);
          descend(k->type == kind::str ? std::string_view(k->text) : std::string_view(), i, v->dict_value(i), depth);
        }
        if (v->state) find(v->state, depth + 1);
        break;
      }
      case kind::list:
      case kind::tuple:
        for (size_t i = 0; i < v->items.size(); ++i) descend({}, i, v->items[i], depth);
        break;
      case kind::object:
        if (v->state) find(v->state, depth + 1);
        for (value* slot : v->items)
          if (slot) find(slot, depth + 1);
        break;
      default:
        break;
    }
  }

  // The path is built in one buffer and copied only for the dicts found.
  void descend(std::string_view key, size_t index, value* child, int depth) {
    if (!child || (child->type != kind::dict && child->type != kind::list && child->type != kind::tuple &&
                   child->type != kind::object))
      return;
    const size_t mark = path_.size();
    if (!path_.empty()) path_ += '/';
    if (key.data())
      path_ += key;
    else
      path_ += std::to_string(index);
    find(child, depth + 1);
    path_.resize(mark);
  }

  const std::function<bool(std::string_view)>& is_sd_key_;
  const value* skip_a_;
  const value* skip_b_;
  const detail::node_marks& tensors_;
  detail::node_marks seen_;
  std::string path_;
  std::vector<std::pair<value*, std::string>> out_;
};

// Iterative: a subtree may nest as deep as --max-depth allows.
bool subtree_has_unsafe(const value* root, std::unordered_set<const value*>& seen) {
  std::vector<const value*> todo{root};
  while (!todo.empty()) {
    const value* v = todo.back();
    todo.pop_back();
    if (!v || !seen.insert(v).second) continue;
    if (v->type == kind::global) {
      if (!is_weights_only_safe_global(v->global_module(), v->global_attr())) return true;
      continue;
    }
    todo.push_back(v->state);
    for (size_t i = v->items.size(); i-- > 0;) todo.push_back(v->items[i]);
  }
  return false;
}

std::vector<std::string> drop_unsafe_entries(checkpoint& c) {
  std::vector<std::string> dropped;
  auto drop_from = [&](value* d, const std::string& prefix) {
    if (!d || d->type != kind::dict) return;
    std::vector<value*> kept;
    for (size_t i = 0; i < d->dict_size(); ++i) {
      std::unordered_set<const value*> seen;
      if (subtree_has_unsafe(d->dict_value(i), seen)) {
        dropped.push_back(prefix + pickle::repr(d->dict_key(i), 120));
      } else {
        kept.push_back(d->dict_key(i));
        kept.push_back(d->dict_value(i));
      }
    }
    d->items = std::move(kept);
  };
  drop_from(only_file(c).pickle->root, "");
  if (c.state_dict_node && c.state_dict_node != only_file(c).pickle->root)
    drop_from(const_cast<value*>(c.state_dict_node), path_to_string(*c.state_dict) + "/");
  std::unordered_set<const value*> seen;
  if (subtree_has_unsafe(only_file(c).pickle->root, seen))
    throw error(errc::unsafe, "--drop-unsafe: unsafe globals remain outside droppable top-level entries");
  return dropped;
}

const file_source& file_of(const checkpoint& c) {
  auto* fs = dynamic_cast<const file_source*>(only_file(c).source.get());
  if (!fs) throw error(errc::usage, "rekey needs a checkpoint opened from a file");
  return *fs;
}

// The alignment the input was written with: its `.storage_alignment` record is copied, so
// the data must be padded to what it says, or torch.load's calculate_storage_offsets mode
// would compute wrong offsets.
uint64_t output_alignment(const checkpoint& c) {
  const uint64_t a = c.storage_alignment;
  if (a == 0 || a > zip::writer::kMaxAlignment)
    throw_unsupported("the input's .storage_alignment is not an alignment a zip writer can pad to (1 to " +
                      std::to_string(zip::writer::kMaxAlignment) + ")");
  return a;
}

// The written file must read back as what we meant to write before it replaces anything.
// A stream cannot be read back; it gets the same bytes.
void verify_output(const output_file& written, const checkpoint& in, const std::vector<std::string>& expected_keys,
                   const open_options& reader) {
  if (written.is_stream()) return;
  checkpoint out = open_checkpoint(written.temp_path(), reader);
  if (out.tensors.size() != in.tensors.size() || out.storages.size() != in.storages.size())
    throw error(errc::io, "the written file does not read back with the same tensors (internal error; nothing replaced)");
  std::vector<std::string> got;
  if (out.format == file_format::safetensors) {
    for (size_t k = 0; k < out.keys.size(); ++k) got.emplace_back(out.keys.key(k));
  } else if (out.state_dict_node) {
    got = str_keys(out.state_dict_node);
  }
  if (got != expected_keys)
    throw error(errc::io, "the written file does not read back with the new keys (internal error; nothing replaced)");
}

[[noreturn]] void not_read_back(const std::string& what) {
  throw error(errc::io, "the written file does not read back " + what + " (internal error; nothing replaced)");
}

// The pickle made must decode to a state dict, where the input had it, that holds the new
// keys in order. Checked while no other tree is alive (the input's was released): for a
// million tensors a decoded tree is most of rekey's memory, and two at once were its peak.
void check_pickle_reads_back(const uint8_t* pkl, size_t size, const checkpoint& in, const rekey_plan& plan,
                             const open_options& reader) {
  pickle::parse_options po;
  po.lim = reader.pickle_limits;
  pickle::document doc = pickle::parse(pkl, size, po);
  const value* sd = doc.root;
  for (const path_element& step : in.state_dict ? *in.state_dict : value_path{}) {
    const std::string* key = std::get_if<std::string>(&step);
    const value* next = nullptr;
    if (key && sd && sd->type == kind::dict)
      for (size_t i = 0; i < sd->dict_size() && !next; ++i)
        if (sd->dict_key(i)->type == kind::str && sd->dict_key(i)->text == *key) next = sd->dict_value(i);
    sd = next;
  }
  if (!sd || sd->type != kind::dict) not_read_back("with its state dict");
  size_t n = 0;
  for (size_t i = 0; i < sd->dict_size(); ++i) {
    const value* k = sd->dict_key(i);
    if (k->type != kind::str) continue;
    if (n >= plan.mapping.size() || k->text != plan.mapping[n].second) not_read_back("with the new keys");
    ++n;
  }
  if (n != plan.mapping.size()) not_read_back("with the new keys");
}

// The pickle rekey made, as the zip writer is to store it: its size and CRC-32, which the
// written archive must show, and for a stream the bytes themselves.
struct made_pickle {
  uint64_t size = 0;
  uint32_t crc32 = 0;
  std::vector<uint8_t> bytes;  // a stream's only
};

// The torch archive written must read back as what we meant to write: the same records in
// the same order with the same sizes and CRC-32s, data.pkl with the size and CRC-32 of the
// pickle made, and that pickle decoding to the new keys. Every record but data.pkl is a
// verbatim copy, so this is checked without building the tensor records a second time (for
// a million tensors, a second open_checkpoint doubled rekey's time and memory). With
// release_input the input's archive is freed once compared, before data.pkl is decoded.
//
// The pickle is decoded only when it cannot be shown cheaper to be the input's own (which
// did decode) with just the key texts renamed in place changed: read from the input
// again, the two are compared opcode by opcode (pickle_lockstep.h; formats.md §3.1.1). For a
// million tensors a decode was a tenth of rekey's time. `log` null: decode.
void verify_torch_output(const std::string& temp, checkpoint& in, const made_pickle& pkl, const rekey_plan& plan,
                         const rekey_request& req, in_place_log* log) {
  file_source src(temp);
  // The names are the input's, checked one by one here: no second index of them.
  auto ar = zip::archive::open_like(src, *only_file(in).zip, req.reader.zip_limits);
  {
    const auto& before = only_file(in).zip->entries();
    const auto& after = ar->entries();
    if (before.size() != after.size()) not_read_back("with the same records");
    for (size_t i = 0; i < before.size(); ++i) {
      if (before[i].record != after[i].record) not_read_back("with the same records");
      if (before[i].record == "data.pkl") continue;
      if (before[i].uncompressed_size != after[i].uncompressed_size || before[i].crc32 != after[i].crc32)
        not_read_back("with record " + std::string(before[i].record) + " unchanged");
    }
  }
  std::vector<uint8_t> before;
  uint64_t before_base = 0;
  if (log) {
    const zip::entry* old = only_file(in).zip->find("data.pkl");
    if (!old) log = nullptr;
    if (log) {
      before = only_file(in).zip->read_record(*old);
      before_base = old->method == 0 ? old->data_offset : 0;  // as parse_record_pickle gave value::offset
    }
  }
  if (req.release_input) only_file(in).zip.reset();
  const zip::entry* data = ar->find("data.pkl");
  if (!data || data->uncompressed_size != pkl.size || data->crc32 != pkl.crc32) not_read_back("with the pickle written");
  const std::vector<uint8_t> bytes = ar->read_record(*data);
  if (bytes.size() != pkl.size || zip::crc32_update(0, bytes.data(), bytes.size()) != pkl.crc32)
    not_read_back("with the pickle written");
  ar.reset();
  if (log) {
    std::vector<detail::renamed_str> renamed = log->all(plan);
    bool usable = true;
    for (auto& r : renamed) {
      if (r.pos < before_base) usable = false;
      r.pos -= before_base;
    }
    auto by_pos = [](const detail::renamed_str& a, const detail::renamed_str& b) { return a.pos < b.pos; };
    if (!std::is_sorted(renamed.begin(), renamed.end(), by_pos)) std::sort(renamed.begin(), renamed.end(), by_pos);
    for (size_t i = 1; i < renamed.size() && usable; ++i) usable = renamed[i].pos != renamed[i - 1].pos;
    if (usable && detail::same_but_renamed(before.data(), before.size(), bytes.data(), bytes.size(), renamed,
                                           req.reader.pickle_limits))
      return;
  }
  std::vector<uint8_t>().swap(before);
  check_pickle_reads_back(bytes.data(), bytes.size(), in, plan, req.reader);
}

// What the new data.pkl will about weigh: the old one, with each renamed key's length change
// (in the state dict and in each dict mirroring it) and some room for new memo entries and
// `_metadata` wrappers. Reserved up front, a pickle of 80 MB is not grown by doubling, which
// held the old and the new buffer (up to three times its size) at rekey's peak.
size_t expected_pickle_size(const checkpoint& c, const rekey_result& result) {
  const zip::entry* data = only_file(c).zip->find("data.pkl");
  if (!data) return 0;
  uint64_t grow = 0;
  for (const auto& [from, to] : result.plan.mapping)
    if (to.size() > from.size()) grow += to.size() - from.size();
  const uint64_t expected = data->uncompressed_size + grow * (1 + result.mirrored_dicts.size());
  return size_t(std::min<uint64_t>(expected + expected / 64 + (64 << 10), uint64_t(1) << 40));
}

// With release_input: the tensor, alias, storage and entry lists are not needed to write the
// new archive (the records are copied from the zip's entries), and for a million tensors they
// are a third of what is alive while the pickle is written.
void release_records(checkpoint& c) {
  std::vector<tensor_record>().swap(c.tensors);
  std::vector<tensor_alias>().swap(c.aliases);
  std::vector<storage_record>().swap(c.storages);
  std::vector<entry_summary>().swap(c.entries);
  c.keys.clear();  // they name tensor records, gone now
}

// Small records (a million one-element tensors) are copied from a window of the source read
// in large pieces: one copy_file_range per record cost two system calls each.
constexpr uint64_t kSmallRecord = 64 << 10;

void write_torch_zip(checkpoint& c, const rekey_request& req, rekey_result& result, in_place_log* log) {
  const pickle::document& doc = *only_file(c).pickle;
  output_file& out = *req.output;
  made_pickle pkl;
  // Below 4 GiB a stored record's local header is the same whatever its size (formats.md
  // §2.1), so the pickle is written in one pass and measured as it goes; the estimate is
  // the old size plus the renamed keys' growth, so twice it is a safe bound. (Two passes
  // were a fifth of rekey's time for a million tensors.)
  const bool one_pass = !out.is_stream() && expected_pickle_size(c, result) < (uint64_t(1) << 31);
  if (out.is_stream()) {
    // A stream cannot be read back, nor taken back once written: its pickle is made whole
    // and decoded before anything is written.
    pkl.bytes = pickle::write(doc.root, 2, &doc, expected_pickle_size(c, result));
    // Should the estimate have fallen short, growth left up to half of it slack, which is
    // given back; a 1/64 over-estimate is not worth a second copy of 80 MB.
    if (pkl.bytes.capacity() - pkl.bytes.size() > pkl.bytes.size() / 32) pkl.bytes.shrink_to_fit();
    pkl.size = pkl.bytes.size();
    if (req.release_input) release_pickle(c);
    check_pickle_reads_back(pkl.bytes.data(), pkl.bytes.size(), c, result.plan, req.reader);
  } else if (!one_pass) {
    // A file gets the pickle streamed from the tree, never held whole beside it (for a
    // million tensors 100 MB at rekey's peak). A pickle that may reach 4 GiB needs its size
    // before its zip header (the header then has a ZIP64 field): a first pass measures it.
    pkl.size = pickle::write_to([&pkl](const uint8_t* p, size_t n) { pkl.crc32 = zip::crc32_update(pkl.crc32, p, n); },
                                doc.root, 2, &doc);
  }
  const file_source& src = file_of(c);
  {
    zip::writer w(out.fd(), only_file(c).zip->prefix(), output_alignment(c));
    // The names are the input's, which its reader found distinct; a file is read back, and
    // its reader refuses repeated names again. A stream keeps the writer's own check.
    if (!out.is_stream()) w.trust_unique_names();
    // Room for every record's name is made after data.pkl (torch's first record) is written:
    // a million names' index beside the tree was 32 MB at rekey's peak.
    bool reserved = false;
    w.on_bytes_out([&](uint64_t bytes_out) {
      out.start_writeback(bytes_out);
      if (req.progress) req.progress(bytes_out, only_file(c).size);
    });
    zip::source_window window(src.fd());
    // Records in their original order; only data.pkl changes.
    for (const zip::entry& e : only_file(c).zip->entries()) {
      if (e.record == "data.pkl") {
        if (out.is_stream()) {
          w.add_record("data.pkl", pkl.bytes);
        } else {
          // After a measuring pass, the second gives the same bytes (the writer is a
          // function of the tree): the zip writer refuses any other count, and the read-back
          // compares the CRC-32. In one pass, size and CRC-32 are what the zip writer saw.
          if (one_pass)
            w.begin_record_below_4gib("data.pkl");
          else
            w.begin_record("data.pkl", pkl.size);
          pickle::write_to([&w](const uint8_t* p, size_t n) { w.write(p, n); }, doc.root, 2, &doc);
          w.end_record();
          if (one_pass) {
            pkl.size = w.last_record_size();
            pkl.crc32 = w.last_record_crc32();
          }
          if (req.release_input) release_pickle(c);  // the tree is written; nothing reads it again
        }
        continue;
      }
      if (!reserved) {
        w.reserve(only_file(c).zip->entries().size());
        reserved = true;
      }
      if (e.method == 0 && e.compressed_size <= kSmallRecord) {
        w.add_record_known_crc(e.record, window.bytes(e.data_offset, size_t(e.compressed_size)),
                               size_t(e.compressed_size), e.crc32);
      } else if (e.method == 0) {
        w.add_record_copy(e.record, src.fd(), e.data_offset, e.compressed_size, e.crc32);
      } else {
        w.add_record(e.record, only_file(c).zip->read_record(e));
      }
    }
    w.finish();
    result.bytes_written = w.offset();
  }
  if (req.release_input) release_pickle(c);
  if (out.is_stream()) return;
  verify_torch_output(out.temp_path(), c, pkl, result.plan, req, log);
}

void write_safetensors(checkpoint& c, const rekey_request& req, rekey_result& result, const renamer& rename,
                       std::vector<std::string>& new_names) {
  const safetensors::header& h = *only_file(c).st_header;
  auto raw = only_file(c).source->read_vector(8, size_t(h.header_size));
  // The reader already took this header (its nesting is bounded there).
  nlohmann::ordered_json in = detail::parse_ordered_json(
      std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()), 64, [&](const detail::json_failure& f) {
        throw error(errc::corrupt, "the safetensors header does not parse as JSON: " + f.what, 8).with_file(c.path);
      });
  detail::ordered_object_builder out_json;
  // __metadata__ first, then the tensors in their original order with their original
  // dtype, shape and offsets: the data buffer is copied unchanged.
  if (in.contains("__metadata__")) out_json.set("__metadata__", in["__metadata__"]);
  for (auto& [name, entry] : in.items()) {
    if (name == "__metadata__") continue;
    std::string renamed = rename(name);
    new_names.push_back(renamed);
    out_json.set(renamed, std::move(entry));
  }
  std::string text = out_json.take().dump();
  // The reference writer pads the header with spaces so the data starts 8-aligned.
  while ((8 + text.size()) % 8 != 0) text += ' ';
  output_file& out = *req.output;
  uint8_t len[8];
  store_u64(len, text.size());
  out.write(len, 8);
  out.write(text.data(), text.size());
  const uint64_t head = 8 + text.size();
  copy_range(file_of(c).fd(), c.path, h.data_start, only_file(c).size - h.data_start, out.fd(), out.path(),
             [&](uint64_t copied) {
               out.start_writeback(head + copied);
               if (req.progress) req.progress(head + copied, head + only_file(c).size - h.data_start);
             });
  result.bytes_written = head + (only_file(c).size - h.data_start);
  verify_output(out, c, new_names, req.reader);
}

}  // namespace

std::vector<std::string> rekey_keys(const checkpoint& c) {
  std::vector<std::string> keys;
  // A table of keys, not a pickled dict: safetensors, and a torch.export archive's weights.
  if (c.format == file_format::safetensors || c.format == file_format::pt2) {
    keys.reserve(c.keys.size());
    for (size_t k = 0; k < c.keys.size(); ++k) keys.emplace_back(c.keys.key(k));
    return keys;
  }
  if (!c.state_dict_node)
    throw error(errc::unsupported, "no state dict found to rekey (inspect shows where the tensors are)").with_file(c.path);
  return str_keys(c.state_dict_node);
}

rekey_result rekey_file(checkpoint& c, const rekey_request& req) {
  rekey_result result;
  only_file(c);
  if (c.format == file_format::torchscript)
    throw error(errc::unsupported,
                "TorchScript archive: its parameter names live in its code, so they cannot be renamed; "
                "load the weights into it with `ckptool materialize --model` instead")
        .with_file(c.path);
  if (c.format == file_format::pt2) {
    try {
      detail::rekey_pt2(c, req, result);
    } catch (error& e) {
      if (e.file().empty()) e.with_file(req.output && !req.dry_run && e.kind() == errc::io ? req.output->path() : c.path);
      throw;
    }
    return result;
  }
  if (!c.module_class.empty())
    throw error(errc::unsupported,
                "a pickled nn.Module (" + c.module_class +
                    "): its keys are attribute names that its class's code, which the file does not hold, "
                    "refers to, so renaming them cannot be exact; `ckptool materialize FILE --device cpu -o OUT` "
                    "writes its state dict, which rekey can rename")
        .with_file(c.path);
  if (c.format == file_format::torch_legacy)
    throw error(errc::unsupported, "legacy (pre-1.6) torch file: re-save it with torch.save to rekey it").with_file(c.path);

  if (c.format != file_format::safetensors && !c.unsafe_globals.empty()) {
    if (req.unsafe == unsafe_policy::refuse)
      throw error(errc::unsafe, "the pickle names globals that torch.load would run: " +
                                    text::join_names(c.unsafe_globals, 8) +
                                    " (rekey --keep-unsafe keeps them as they are, --drop-unsafe removes the entries holding them)")
          .with_file(c.path);
    if (req.unsafe == unsafe_policy::drop) result.dropped = drop_unsafe_entries(c);
  }

  renamer rename = from_ops(req.ops);
  if (c.format != file_format::safetensors && !c.state_dict_node)
    throw error(errc::unsupported, "no state dict found to rekey (inspect shows where the tensors are)").with_file(c.path);
  // Which nodes are tensors, for the mirror search below (a bit a node); then, when the
  // caller lets go of c, its tensor records are freed before the keys are copied and the
  // plan, the rename and the write add theirs: open's records and these never coexist.
  std::unique_ptr<detail::node_marks> tensor_nodes;
  if (c.format != file_format::safetensors) {
    tensor_nodes = std::make_unique<detail::node_marks>(*only_file(c).pickle);
    for (const auto& t : c.tensors) tensor_nodes->insert(t.node);
    if (req.release_input && !req.dry_run) release_records(c);
  }
  // From the state dict's pickle (or a safetensors key table), which release_records keeps.
  std::vector<std::string> old_keys = rekey_keys(c);
  result.plan = plan_rekey(std::move(old_keys), req.ops);  // it keeps them (as mapping[i].first)
  if (!result.plan.emptied.empty())
    throw error(errc::check_failed, std::to_string(result.plan.emptied.size()) +
                                        " key(s) would be renamed to the empty string; nothing written: " +
                                        text::join_names(result.plan.emptied, 5))
        .with_file(c.path);
  if (!result.plan.collisions.empty()) {
    std::vector<std::string> lines;
    for (auto& [to, from] : result.plan.collisions) lines.push_back("'" + to + "' <- " + text::join_names(from, 4));
    throw error(errc::check_failed, std::to_string(result.plan.collisions.size()) +
                                        " new key(s) would be claimed by several keys; nothing written: " +
                                        text::join_names(lines, 5))
        .with_file(c.path);
  }

  in_place_log log;
  // Whatever way rekey_file is left: the tree borrows the plan's names, which go with it.
  struct tree_releaser {
    checkpoint** c;
    ~tree_releaser() {
      if (*c) release_pickle(**c);
    }
  };
  checkpoint* release_tree_on_exit = nullptr;
  const tree_releaser releaser{&release_tree_on_exit};
  bool log_complete = true;  // every change to the tree is a logged in-place rename
  if (c.format != file_format::safetensors) {
    pickle::document& doc = *only_file(c).pickle;
    value* sd = const_cast<value*>(c.state_dict_node);
    value* meta = metadata_of(sd);
    // The state dict's keys, found where the plan keeps them: 16 bytes a key, not a hash node.
    const auto& mapping = result.plan.mapping;
    auto old_key = [&](size_t i) -> std::string_view { return mapping[i].first; };
    detail::string_index sd_index(mapping.size());
    for (size_t i = 0; i < mapping.size(); ++i) sd_index.insert(i, old_key);
    const std::function<bool(std::string_view)> is_sd_key = [&](std::string_view k) {
      return sd_index.find(k, old_key) != detail::string_index::npos;
    };
    std::vector<std::pair<value*, std::string>> mirrors =
        mirror_finder(is_sd_key, sd, meta, *tensor_nodes, doc).run(doc.root);
    const std::vector<std::pair<value*, std::string>> param_lists = optimizer_param_lists(doc, mirrors);
    tensor_nodes.reset();
    if (!req.dry_run) {
      // The plan already holds every state-dict key's new name, in the dict's order.
      const reference_counts refs(doc);
      log.sd_offsets.reserve(mapping.size());
      // The new names stay in the plan, which outlives the tree where the tree is released
      // here (release_input); otherwise the tree gets copies.
      rename_keys_indexed(
          doc, refs, sd, [&](size_t i, std::string_view) -> const std::string& { return mapping[i].second; },
          false, &log, true, req.release_input);
      if (req.release_input) release_tree_on_exit = &c;
      if (meta)
        result.metadata_renamed = rename_metadata(doc, refs, meta, derive_module_rules(result.plan.mapping), &log);
      // A mirror's keys are state-dict keys, which the plan renames without collisions.
      // Not logged: a mirror could lie on the path to the state dict, which the check
      // against the input would not see renamed.
      // The params lists first: a name the memo shares with a mirror's key is still the old
      // name here (a shared key node is replaced, not renamed, below; so is a shared element).
      for (auto& [l, path] : param_lists)
        if (rename_names_in_list(doc, refs, l, is_sd_key, rename)) result.mirrored_dicts.push_back(path);
      for (auto& [d, path] : mirrors)
        if (rename_keys(doc, refs, d, rename, false)) result.mirrored_dicts.push_back(path);
      log_complete = result.mirrored_dicts.empty();
    } else {
      for (auto& [d, path] : mirrors) result.mirrored_dicts.push_back(path);
      for (auto& [l, path] : param_lists) result.mirrored_dicts.push_back(path);
    }
  }
  if (req.dry_run) return result;
  if (!req.output || req.output->fd() < 0) throw error(errc::usage, "rekey: no open output given");

  try {
    if (c.format == file_format::safetensors) {
      std::vector<std::string> written;
      write_safetensors(c, req, result, rename, written);
    } else {
      write_torch_zip(c, req, result, log_complete ? &log : nullptr);
    }
  } catch (error& e) {
    e.with_file(req.output->path());
    throw;
  }
  return result;
}

}  // namespace ckpt
