#include "diff/entry_leaves.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "base/text.h"
#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/pickle.h"

namespace ckpt::detail {
namespace {

using pickle::kind;
using pickle::value;

// Deeper than the pickle machine's default nesting bound: such a value is shown whole.
constexpr int kMaxDepth = 1000;

// A call that rebuilds a tensor (torch._utils._rebuild_tensor_v2, _rebuild_parameter,
// torch._tensor._rebuild_from_type_v2, ...): a tensor whatever its record says.
bool is_rebuild(const value* v) {
  if (v->type != kind::object) return false;
  const value* g = v->callable_global();
  if (!g) return false;
  const std::string_view module = g->global_module(), name = g->global_attr();
  return (module == "torch" || module.compare(0, 6, "torch.") == 0) && name.compare(0, 9, "_rebuild_") == 0;
}

// Python's type name as inspect gives it: OrderedDict named as such, an object by its class.
std::string type_of(const value* v) {
  if (v->type == kind::dict && v->flag) return "OrderedDict";
  if (v->type == kind::object) {
    const value* g = v->callable_global();
    return g ? g->global_name() : "object";
  }
  return text::python_type_name(v->type);
}

// A path element as a leaf's path spells it: its text, unless that could be read as more
// than one element (a '/' inside) or as such a quoted one: then quoted, every quote and
// backslash escaped, so that no two element lists spell one path (§12.4).
std::string element(std::string_view text) {
  if (text.find('/') == std::string_view::npos && (text.empty() || (text[0] != '\'' && text[0] != '"')))
    return std::string(text);
  return text::quote(text, std::string_view::npos);
}

// A dict key as str(key) spells it, which is what DCP's flattening makes of it (§12.4).
std::string key_text(const value* k) {
  if (k->type == kind::str) return std::string(k->text);
  if (k->type == kind::integer) return std::to_string(k->integer);
  return pickle::repr(k, 80);
}

// What each element of a path is (entry_leaf::kinds): a dict's str key, another key (an
// int, a tuple), a sequence's index, a part of an object.
constexpr char kStrKey = 's', kOtherKey = 'k', kIndex = 'n', kObjectPart = 'o';

// An entry's own path: its elements spelled, and their kinds. Its integers are dict keys
// in a pickle (summarize_entries), list indexes in a DCP planner path (open_dcp).
std::string path_text(const value_path& path) {
  std::string out;
  for (const auto& step : path) {
    if (!out.empty()) out += '/';
    if (const auto* s = std::get_if<std::string>(&step))
      out += element(*s);
    else
      out += std::to_string(std::get<int64_t>(step));
  }
  return out;
}

std::string path_kinds(const value_path& path, char integer_kind) {
  std::string out;
  for (const auto& step : path) out += std::holds_alternative<std::string>(step) ? kStrKey : integer_kind;
  return out;
}

class walker {
 public:
  // `c`: the checkpoint whose tensor records the values' rebuild calls may be (null for a
  // value decoded from a pickle of its own); `file` names it in errors.
  walker(const checkpoint* c, std::string file, std::vector<entry_leaf>& out, char integer_kind)
      : c_(c), file_(std::move(file)), out_(out), integer_kind_(integer_kind) {
    if (c)
      for (size_t i = 0; i < c->tensors.size(); ++i)
        if (c->tensors[i].node) record_of_.emplace(c->tensors[i].node, i);
  }

  // An entry's value, at the entry's path. A DAG that expands past the bound is refused
  // before any leaf is made: counting costs one visit per shared node, while making the
  // leaves of a 40-level shared-list bomb would first fill gigabytes with 4 M of them.
  void walk_entry(const value* v, const value_path& path) {
    if (out_.size() + count_leaves(v, 0) > kMaxLeaves) refuse();
    dotted_ = path_to_string(path, '.');
    kinds_ = path_kinds(path, integer_kind_);
    walk(v, path_text(path), 0);
  }

 private:
  // `step`: the element that led here from the parent (a key, an index, "(state)", ...).
  void walk(const value* v, const std::string& path, int depth, std::string_view step = {}, char step_kind = 0) {
    const size_t parent = dotted_.size(), kinds = kinds_.size();
    if (depth > 0) {
      if (parent) dotted_ += '.';
      dotted_ += step;
      kinds_ += step_kind;
    }
    walk_here(v, path, depth);
    dotted_.resize(parent);
    kinds_.resize(kinds);
  }

  void walk_here(const value* v, const std::string& path, int depth) {
    if (std::optional<size_t> t = record(v)) return tensor_leaf(path, t);
    if (const entry_tensor* e = inside(v)) return tensor_leaf(path, e);
    if (is_rebuild(v)) return tensor_leaf(path, nullptr);
    if (depth > kMaxDepth || open_.count(v)) {
      entry_leaf l = scalar(v, path);
      l.partial = true;
      if (open_.count(v)) l.shown = l.exact = "<cycle: a value that contains itself>";
      return add(std::move(l));
    }
    open_.insert(v);
    switch (v->type) {
      case kind::dict:
        if (v->dict_size() == 0) {
          add(scalar(v, path));
          break;
        }
        for (size_t i = 0; i < v->dict_size(); ++i) {
          const value* key = v->dict_key(i);
          const std::string k = key_text(key);
          walk(v->dict_value(i), path + "/" + element(k), depth + 1, k, key->type == kind::str ? kStrKey : kOtherKey);
        }
        break;
      case kind::list:
      case kind::tuple:
        // A list DCP flattens leaves no trace of its own; one it keeps whole (a tuple, or
        // a list of plain values) is a leaf for its type and length, then its elements.
        if (v->type == kind::tuple || dcp_keeps_whole(v, 0)) add(sequence(v, path));
        for (size_t i = 0; i < v->items.size(); ++i) {
          const std::string index = std::to_string(i);
          walk(v->items[i], path + "/" + index, depth + 1, index, kIndex);
        }
        break;
      case kind::object:
        walk_object(v, path, depth);
        break;
      default:
        add(scalar(v, path));
    }
    open_.erase(v);
  }

  // The leaves walk_here would make of v (its cases in the same order), saturating past
  // kMaxLeaves. Exact but where dict keys have equal str() (1 and "1": add keeps one leaf
  // per path), which it overstates; an overstatement can only refuse, never let a walk grow
  // past the bound. A subtree is remembered only when no cycle reached out of it, because
  // then its count does not depend on the path walked to it.
  size_t count_leaves(const value* v, int depth) {
    if (record(v) || inside(v) || is_rebuild(v) || depth > kMaxDepth) return 1;
    if (open_.count(v)) {
      cycle_seen_ = true;
      return 1;
    }
    auto known = counted_.find(v);
    if (known != counted_.end()) return known->second;
    const bool outer_cycle = cycle_seen_;
    cycle_seen_ = false;
    open_.insert(v);
    size_t n = 0;
    auto below = [&](const value* x) {
      if (x && n <= kMaxLeaves) n += count_leaves(x, depth + 1);
    };
    switch (v->type) {
      case kind::dict:
        if (v->dict_size() == 0) n = 1;
        for (size_t i = 0; i < v->dict_size(); ++i) below(v->dict_value(i));
        break;
      case kind::list:
      case kind::tuple:
        if (v->type == kind::tuple || dcp_keeps_whole(v, 0)) n = 1;
        for (const value* e : v->items) below(e);
        break;
      case kind::object:
        n = 1;
        for (size_t slot : {pickle::kArgs, pickle::kKwargs, pickle::kListItems, pickle::kDictItems})
          if (slot < v->items.size()) below(v->items[slot]);
        below(v->state);
        break;
      default:
        n = 1;
    }
    open_.erase(v);
    n = std::min(n, kMaxLeaves + 1);
    if (!cycle_seen_) counted_.emplace(v, n);
    cycle_seen_ = cycle_seen_ || outer_cycle;
    return n;
  }

  [[noreturn]] void refuse() const {
    throw error(errc::unsupported, "the non-tensor entries expand to more than " + std::to_string(kMaxLeaves) +
                                       " values; pass --ignore-entries to compare tensors only")
        .with_file(file_);
  }

  // v's entry in `map`, or (a parameter) its inner tensor's: keyed by rebuild calls.
  template <class Map>
  static const typename Map::mapped_type* find_rebuild(const Map& map, const value* v) {
    auto it = map.find(v);
    if (it != map.end()) return &it->second;
    // A parameter's record is its inner tensor's rebuild call.
    if (is_rebuild(v) && v->items.size() > pickle::kArgs && v->items[pickle::kArgs] &&
        v->items[pickle::kArgs]->type == kind::tuple && !v->items[pickle::kArgs]->items.empty()) {
      auto inner = map.find(v->items[pickle::kArgs]->items[0]);
      if (inner != map.end()) return &inner->second;
    }
    return nullptr;
  }

  std::optional<size_t> record(const value* v) const {
    const size_t* r = find_rebuild(record_of_, v);
    return r ? std::optional<size_t>(*r) : std::nullopt;
  }

  const entry_tensor* inside(const value* v) const {
    const entry_tensor* const* e = find_rebuild(inside_, v);
    return e ? *e : nullptr;
  }

  // torch.distributed.checkpoint's _traverse: a list is kept whole unless it holds a
  // mapping, a tensor, or a list it would not keep whole.
  // Memoized: a list shared many times over (a DAG) is judged once.
  bool dcp_keeps_whole(const value* list, int depth) {
    if (depth > kMaxDepth) return true;
    auto known = whole_.find(list);
    if (known != whole_.end()) return known->second;
    whole_[list] = true;  // a list that contains itself: judged by its other elements
    bool whole = true;
    for (const value* e : list->items) {
      if (e->type == kind::dict || record(e) || is_rebuild(e)) whole = false;
      else if (e->type == kind::list && !dcp_keeps_whole(e, depth + 1)) whole = false;
      if (!whole) break;
    }
    return whole_[list] = whole;
  }

  // An object is compared by what pickle says makes it, never by running that: the
  // callable's name and how it was called, then its arguments and state as paths below it.
  void walk_object(const value* v, const std::string& path, int depth) {
    entry_leaf l;
    l.path = path;
    l.type = type_of(v);
    l.shown = pickle::repr(v, kShownChars);
    const value* callable = v->items.size() > pickle::kCallable ? v->items[pickle::kCallable] : nullptr;
    l.exact = "object " + std::to_string(int(v->op)) + " " + (callable ? pickle::repr(callable, kExactChars) : "");
    add(std::move(l));
    auto slot = [&](size_t i) { return i < v->items.size() ? v->items[i] : nullptr; };
    auto below = [&](const value* x, const char* step) {
      walk(x, path + "/" + step, depth + 1, step, kObjectPart);
    };
    if (const value* args = slot(pickle::kArgs)) below(args, "(args)");
    if (const value* kwargs = slot(pickle::kKwargs)) below(kwargs, "(kwargs)");
    if (const value* items = slot(pickle::kListItems)) below(items, "(extend)");
    if (const value* items = slot(pickle::kDictItems)) below(items, "(update)");
    if (v->state) below(v->state, "(state)");
  }

  entry_leaf sequence(const value* v, const std::string& path) const {
    entry_leaf l;
    l.path = path;
    l.type = type_of(v);
    l.shown = pickle::repr(v, kShownChars);
    l.exact = "length " + std::to_string(v->items.size());
    return l;
  }

  static entry_leaf scalar(const value* v, const std::string& path) {
    entry_leaf l;
    l.path = path;
    l.type = type_of(v);
    l.shown = pickle::repr(v, kShownChars);
    if (v->type == kind::str || v->type == kind::bytes || v->type == kind::bytearray) {
      l.exact = std::string(v->text);
    } else if (v->type == kind::set || v->type == kind::frozenset) {
      // Equal sets may be pickled in different orders.
      std::vector<std::string> items;
      for (const value* e : v->items) items.push_back(pickle::repr(e, kExactChars));
      std::sort(items.begin(), items.end());
      for (const std::string& s : items) l.exact += s + "\n";
      l.partial = l.exact.size() > kExactChars;
    } else {
      l.exact = pickle::repr(v, kExactChars);
      l.partial = l.exact.size() > kExactChars;
    }
    return l;
  }

  void tensor_leaf(const std::string& path, std::optional<size_t> t) {
    const tensor_record& r = c_->tensors[*t];
    entry_leaf l;
    l.path = path;
    l.type = "tensor";
    l.tensor = t;
    l.shown = l.exact = std::string(name(r.type)) + " " + text::shape(std::vector<int64_t>(r.shape.begin(), r.shape.end()));
    l.dotted = dotted_;
    add(std::move(l));
  }

  // A tensor of a value decoded from a pickle of its own (e null: a rebuild call no record
  // was made for). Without a record its values cannot be read: diff refuses to call it equal.
  void tensor_leaf(const std::string& path, const entry_tensor* e) {
    entry_leaf l;
    l.path = path;
    l.type = "tensor";
    if (e) {
      l.tensor = e->record;
      l.shown = l.exact = std::string(name(e->type)) + " " + text::shape(e->shape);
    } else {
      l.shown = l.exact = "a tensor inside a non-tensor item";
    }
    l.unread_tensor = !l.tensor;
    l.dotted = dotted_;
    add(std::move(l));
  }

 public:
  void add_summary(entry_leaf l) { add(std::move(l), false); }

  // The tensors inside the value walked next (their rebuild calls are its nodes).
  void set_inside(const std::vector<entry_tensor>& tensors) {
    inside_.clear();
    // Keyed by nodes of a pickle that is gone: their addresses are reused.
    whole_.clear();
    counted_.clear();
    for (const entry_tensor& e : tensors)
      if (e.node) inside_.emplace(e.node, &e);
  }

 private:
  // `here`: a leaf of the value being walked, at the walk's place (else its kinds are set).
  void add(entry_leaf l, bool here = true) {
    if (here) l.kinds = kinds_;
    // A path is one leaf, but for dict keys that str() alike ({1: a, "1": b}): both kept.
    if (!paths_.insert(l.path + '\0' + l.kinds).second) return;
    if (out_.size() >= kMaxLeaves) refuse();
    out_.push_back(std::move(l));
  }

  const checkpoint* c_;
  std::string file_;
  std::vector<entry_leaf>& out_;
  std::unordered_map<const value*, size_t> record_of_;
  std::unordered_map<const value*, const entry_tensor*> inside_;  // during walked_values::seen
  std::unordered_set<std::string> paths_;
  std::unordered_set<const value*> open_;
  std::unordered_map<const value*, bool> whole_;
  std::unordered_map<const value*, size_t> counted_;  // count_leaves of cycle-free subtrees
  bool cycle_seen_ = false;
  std::string dotted_;  // the path being walked, joined by '.' as DCP names keys
  std::string kinds_;   // the kinds of its elements
  char integer_kind_;   // the kind of an integer in an entry's own path
};

bool ends_cut(const std::string& s) { return s.size() >= 3 && s.compare(s.size() - 3, 3, "...") == 0; }

// An entry summary that stands for tensors (a repr never ends so: a str's is quoted, a cut
// one ends "..."): "list, 1 item, 21 tensors inside" (checkpoint.cpp entry_value),
// "2 tensors inside (not loaded: a BYTE_IO item)" (open_dcp), perhaps with "  [unsafe: ...]".
bool summarizes_tensors(const std::string& v) {
  if (text::ends_with(v, " tensor inside") || text::ends_with(v, " tensors inside")) return true;
  return !v.empty() && v[0] >= '1' && v[0] <= '9' && v.find(" inside (not loaded: a BYTE_IO item)") != std::string::npos;
}

}  // namespace

struct walked_values::state {
  std::vector<entry_leaf> leaves;
  walker w;
  // The values of a DCP directory's items: their paths are planner paths.
  explicit state(std::string file) : w(nullptr, std::move(file), leaves, kIndex) {}
};

walked_values::walked_values(std::string file) : s_(std::make_unique<state>(std::move(file))) {}
walked_values::~walked_values() = default;

void walked_values::seen(const value_path& path, const pickle::value& v, const std::vector<entry_tensor>& tensors) {
  const size_t begin = s_->leaves.size();
  const std::string p = path_text(path);
  s_->w.set_inside(tensors);
  s_->w.walk_entry(&v, path);
  s_->w.set_inside({});  // their nodes die with the value's pickle
  ranges_[p] = {begin, s_->leaves.size()};
}

std::vector<entry_leaf> entry_leaves(const checkpoint& c, const walked_values* walked) {
  std::vector<entry_leaf> out;
  const char integer_kind = c.layout == checkpoint_layout::dcp ? kIndex : kOtherKey;
  walker w(&c, c.path, out, integer_kind);
  for (const entry_summary& e : c.entries) {
    const std::string path = path_text(e.path);
    if (e.node) {
      w.walk_entry(e.node, e.path);
      continue;
    }
    if (walked) {
      auto it = walked->ranges_.find(path);
      if (it != walked->ranges_.end()) {
        for (size_t i = it->second.first; i < it->second.second; ++i) w.add_summary(walked->s_->leaves[i]);
        continue;
      }
    }
    entry_leaf l;
    l.path = path;
    l.kinds = path_kinds(e.path, integer_kind);
    l.type = e.type;
    l.shown = l.exact = e.value;
    l.unread_tensor = summarizes_tensors(e.value);
    l.partial = ends_cut(e.value) || l.unread_tensor;
    w.add_summary(std::move(l));
  }
  return out;
}

namespace {

// A shard index's "metadata" object (formats.md §10.1) but total_size and
// total_parameters, which count the shards' bytes and elements: what the writer was given
// (huggingface_hub's save_torch_state_dict(metadata=...) puts it here, not in the shards).
void index_metadata_leaves(const checkpoint& c, std::vector<entry_leaf>& out) {
  if (c.layout != checkpoint_layout::hf_shard_set || c.index_path.empty()) return;
  constexpr uint64_t kMaxIndexBytes = 256ull << 20;  // hf_index's own bound
  file_source f(c.index_path);
  if (f.size() > kMaxIndexBytes)
    throw error(errc::unsupported, "the index is larger than " + std::to_string(kMaxIndexBytes) + " bytes")
        .with_file(c.index_path);
  const std::vector<uint8_t> bytes = f.read_vector(0, size_t(f.size()));
  // Read once already by open_checkpoint; parsed here again for what the model does not keep.
  const nlohmann::json doc = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (!doc.is_object()) throw error(errc::corrupt, "the index is no longer a JSON object").with_file(c.index_path);
  auto md = doc.find("metadata");
  if (md == doc.end() || !md->is_object()) return;
  for (auto it = md->begin(); it != md->end(); ++it) {
    if (it.key() == "total_size" || it.key() == "total_parameters") continue;
    entry_leaf l;
    l.path = "index/metadata/" + it.key();
    l.type = it->is_string() ? "str" : std::string("JSON ") + it->type_name();
    l.exact = it->dump(-1, ' ', true);  // ASCII: \u escapes
    l.shown = l.exact.size() > kShownChars ? l.exact.substr(0, kShownChars) + "..." : l.exact;
    if (it->is_string()) l.shown = text::quote(it->get<std::string>(), kShownChars);
    out.push_back(std::move(l));
  }
}

}  // namespace

std::vector<entry_leaf> metadata_leaves(const checkpoint& c) {
  std::vector<entry_leaf> out;
  index_metadata_leaves(c, out);
  if (c.format != file_format::safetensors) return out;
  // key -> (file, value) in file order; keys in first-seen order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<size_t, std::string>>> seen;
  size_t files = 0;
  for (size_t f = 0; f < c.files.size(); ++f) {
    if (!c.files[f].st_header) continue;
    ++files;
    for (const auto& [k, v] : c.files[f].st_header->metadata) {
      auto& list = seen[k];
      if (list.empty()) order.push_back(k);
      list.emplace_back(f, v);
    }
  }
  for (const std::string& k : order) {
    const auto& list = seen[k];
    bool agree = list.size() == files;
    for (const auto& [f, v] : list) agree = agree && v == list.front().second;
    entry_leaf l;
    l.path = "__metadata__/" + k;
    l.type = "str";
    if (agree) {
      l.exact = list.front().second;
      l.shown = text::quote(l.exact, kShownChars);
    } else {
      // Shards that disagree: each one's value, by shard (a shard without the key says so).
      for (size_t f = 0; f < c.files.size(); ++f) {
        if (!c.files[f].st_header) continue;
        auto it = std::find_if(list.begin(), list.end(), [&](const auto& p) { return p.first == f; });
        const std::string shard = text::quote(c.files[f].path.substr(c.files[f].path.rfind('/') + 1));
        l.exact += shard + ": " + (it == list.end() ? std::string("(absent)") : text::quote(it->second, kExactChars)) + "; ";
      }
      l.type = "str per shard";
      l.shown = l.exact.size() > kShownChars ? l.exact.substr(0, kShownChars) + "..." : l.exact;
    }
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace ckpt::detail
