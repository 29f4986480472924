#include "ckpt/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "formats/format_detect.h"
#include "formats/legacy_reader.h"
#include "formats/pickled_module.h"
#include "formats/pt2_archive.h"
#include "base/pointer_map.h"
#include "formats/tensor_collector.h"
#include "model/layout.h"
#include "model/open_hf_set.h"
#include "model/open_dcp.h"
#include "model/open_dcp_safetensors.h"
#include "pickle/node_marks.h"
#include "pickle/pickle_accessors.h"
#include "base/text.h"

namespace ckpt {
namespace {

using pickle::kind;
using pickle::value;

const char* const kStateDictHolders[] = {"state_dict", "model_state_dict", "model", "module",
                                         "net", "network", "model_ema", "ema", "weights", "params"};

// Small text records (version, byteorder): parsed strictly, as security.md Z12 asks.
std::string read_small_record(const zip::archive& ar, const zip::entry& e) {
  if (e.uncompressed_size > 64) throw_corrupt("record " + std::string(e.name) + " is longer than 64 bytes", e.local_header_offset);
  auto bytes = ar.read_record(e);
  return std::string(bytes.begin(), bytes.end());
}

void check_version_record(const zip::archive& ar) {
  const zip::entry* e = ar.find(".data/version");
  if (!e) e = ar.find("version");
  // PyTorchStreamReader, which torch.load and torch.jit.load open every archive with,
  // requires one of the two (caffe2/serialize/inline_container.cc, its constructor).
  if (!e)
    throw_corrupt("no version record (neither 'version' nor '.data/version'): torch.load refuses such an archive",
                  0);
  std::string text = read_small_record(ar, *e);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty() || text.size() > 4 || !std::all_of(text.begin(), text.end(), ::isdigit))
    throw_corrupt("record " + std::string(e->name) + " is not a decimal version number", e->data_offset);
  int v = std::stoi(text);
  // caffe2/serialize/versions.h: kMinSupportedFileFormatVersion 1 .. kMaxSupported 0xA.
  if (v < 1 || v > 10)
    throw_unsupported("archive format version " + text + " (this build reads 1 to 10)", e->data_offset);
}

std::string read_byteorder(const zip::archive& ar) {
  const zip::entry* e = ar.find("byteorder");
  if (!e) return "little";  // PyTorch's default since PR #101973
  std::string text = read_small_record(ar, *e);
  if (text != "little" && text != "big")
    throw_corrupt("record " + std::string(e->name) + " must say 'little' or 'big'", e->data_offset);
  return text;
}

// torch.load reads `.storage_alignment` with Python's int(): surrounding whitespace, a
// sign and single underscores between digits are accepted, anything else is a ValueError.
// Accepting exactly that keeps ckptool from reading a file torch.load refuses. Returns the
// value, 0 for a valid literal that is not a positive number below 2^63, nullopt for text
// int() refuses.
std::optional<uint64_t> python_int_value(std::string_view t) {
  auto space = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; };
  while (!t.empty() && space(t.front())) t.remove_prefix(1);
  while (!t.empty() && space(t.back())) t.remove_suffix(1);
  bool negative = false;
  if (!t.empty() && (t.front() == '+' || t.front() == '-')) {
    negative = t.front() == '-';
    t.remove_prefix(1);
  }
  if (t.empty() || t.front() == '_' || t.back() == '_') return std::nullopt;
  uint64_t v = 0;
  bool overflow = false;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_') {
      if (t[i + 1] == '_') return std::nullopt;
    } else if (t[i] < '0' || t[i] > '9') {
      return std::nullopt;
    } else if (!overflow) {
      overflow = v > (uint64_t(INT64_MAX) - uint64_t(t[i] - '0')) / 10;
      v = v * 10 + uint64_t(t[i] - '0');
    }
  }
  return negative || overflow ? 0 : v;
}

uint64_t read_storage_alignment(const zip::archive& ar) {
  const zip::entry* e = ar.find(".storage_alignment");
  if (!e) return 64;  // torch.load's default
  std::optional<uint64_t> v = python_int_value(read_small_record(ar, *e));
  if (!v) throw_corrupt("record " + std::string(e->name) + " is not an integer (torch.load refuses it)", e->data_offset);
  return *v;
}

bool is_torchscript_vocabulary(std::string_view module) {
  return module.substr(0, 9) == "__torch__" || module == "torch.jit._pickle" || module == "builtins";
}

// A global torch.load would import: off the weights_only allowlist and, in a TorchScript
// archive, not one of its scripted classes or typed-container helpers.
bool is_unsafe_global(std::string_view module, std::string_view attr, bool torchscript) {
  return !is_weights_only_safe_global(module, attr) && !(torchscript && is_torchscript_vocabulary(module));
}

// The same for a "module.attr" name as the pickle machine reports globals it met.
bool is_unsafe_global_name(std::string_view full, bool torchscript) {
  size_t dot = full.rfind('.');
  return dot == std::string_view::npos || is_unsafe_global(full.substr(0, dot), full.substr(dot + 1), torchscript);
}

std::unique_ptr<pickle::document> parse_record_pickle(const zip::archive& ar, const zip::entry& e,
                                                      const pickle::limits& lim, bool torchscript) {
  if (e.uncompressed_size > lim.max_pickle_bytes)
    throw_limit("record " + std::string(e.name) + " is " + std::to_string(e.uncompressed_size) +
                    " bytes, over the pickle size limit (raise with --max-pickle-bytes)",
                e.local_header_offset);
  auto bytes = ar.read_record(e);
  pickle::parse_options po;
  po.lim = lim;
  // Offsets in errors are file offsets when the record is stored (it always is in torch files).
  po.base_offset = e.method == 0 ? e.data_offset : 0;
  std::vector<std::string> seen;
  po.globals_seen = &seen;
  try {
    return std::make_unique<pickle::document>(pickle::parse(bytes.data(), bytes.size(), po));
  } catch (const error& broken) {
    // What a malformed pickle imported before it broke is what a scanner needs to know
    // (security.md P5): the error names those globals torch.load would have run.
    std::set<std::string> unsafe;
    for (const auto& g : seen)
      if (is_unsafe_global_name(g, torchscript)) unsafe.insert(g);
    if (unsafe.empty()) throw;
    std::string names;
    for (const auto& g : unsafe) names += (names.empty() ? "" : ", ") + g;
    throw error(broken.kind(), broken.message() + " (before it, the pickle named unsafe globals: " + names + ")",
                broken.offset());
  }
}

// Wider than torch.load's own test (constants.pkl alone): an archive carrying code is
// never read as plain weights (security.md P11).
const zip::entry* first_code_record(const zip::archive& ar) {
  for (const auto& e : ar.entries())
    if (e.record.compare(0, 5, "code/") == 0) return &e;
  return nullptr;
}

bool is_torchscript_archive(const zip::archive& ar) {
  return ar.find("constants.pkl") || ar.find("bytecode.pkl") || ar.find(".data/version") || ar.find("model.json") ||
         first_code_record(ar);
}

std::vector<std::string> records_torch_save_never_writes(const zip::archive& ar) {
  static const char* const kKnown[] = {"data.pkl", "byteorder", "version", ".format_version", ".storage_alignment",
                                       ".data/serialization_id"};
  std::vector<std::string> out;
  for (const auto& e : ar.entries()) {
    if (e.record.compare(0, 5, "data/") == 0) continue;
    if (std::none_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return e.record == k; }))
      out.emplace_back(e.record);
  }
  return out;
}

void collect_globals(checkpoint& c, const pickle::document& doc, bool torchscript) {
  std::set<std::string> all, unsafe;
  for (const value& v : doc.nodes()) {
    if (v.type != kind::global) continue;
    std::string full = v.global_name();
    all.insert(full);
    if (is_unsafe_global(v.global_module(), v.global_attr(), torchscript)) unsafe.insert(full);
  }
  c.globals.assign(all.begin(), all.end());
  c.unsafe_globals.assign(unsafe.begin(), unsafe.end());
}

// The Python type of an entry, as inspect reports it: an OrderedDict is named as such, and
// an object by the class that made it.
// A bit per node of `doc` (tensors of another document, TorchScript's constants, fall back to
// a hash set): for a million tensors a pointer_map here was 32 MB at open's peak.
detail::node_marks tensor_node_set(const checkpoint& c, const pickle::document& doc) {
  detail::node_marks nodes(doc);
  for (const auto& t : c.tensors) nodes.insert(t.node);
  return nodes;
}

void find_state_dict(checkpoint& c, const value* root, const detail::node_marks& tensor_nodes) {
  if (!root) return;
  auto is_state_dict = [&](const value* d) {
    if (!d || d->type != kind::dict || d->dict_size() == 0) return false;
    size_t tensors = 0;
    for (size_t i = 0; i < d->dict_size(); ++i) {
      if (d->dict_key(i)->type != kind::str) return false;
      tensors += tensor_nodes.contains(d->dict_value(i));
    }
    return tensors > 0 && tensors * 2 >= d->dict_size();
  };
  if (is_state_dict(root)) {
    c.state_dict = value_path{};
    c.state_dict_node = root;
    return;
  }
  if (root->type != kind::dict) return;
  auto lookup = [&](std::string_view key) { return detail::str_key(root, key); };
  c.lightning = lookup("pytorch-lightning_version") != nullptr;
  for (const char* holder : kStateDictHolders) {
    if (is_state_dict(lookup(holder))) {
      c.state_dict = value_path{std::string(holder)};
      c.state_dict_node = lookup(holder);
      return;
    }
  }
  for (size_t i = 0; i < root->dict_size(); ++i) {
    if (root->dict_key(i)->type == kind::str && is_state_dict(root->dict_value(i))) {
      c.state_dict = value_path{root->dict_key(i)->text};
      c.state_dict_node = root->dict_value(i);
      return;
    }
  }
}

size_t count_tensors(const value* v, const detail::node_marks& tensor_nodes,
                     std::unordered_set<const value*>& seen, int depth) {
  if (!v || depth > 1000 || !seen.insert(v).second) return 0;
  if (tensor_nodes.contains(v)) return 1;
  size_t n = 0;
  for (const value* c : v->items) n += count_tensors(c, tensor_nodes, seen, depth + 1);
  return n + count_tensors(v->state, tensor_nodes, seen, depth + 1);
}

// Python's repr, except for containers holding tensors: their rebuild calls mean nothing
// to a reader, so those are summarized ("list, 1 item, 21 tensors inside").
std::string entry_value(const value* v, const detail::node_marks& tensor_nodes) {
  std::unordered_set<const value*> seen;
  size_t tensors = count_tensors(v, tensor_nodes, seen, 0);
  if (tensors == 0) return pickle::repr(v, 120);
  size_t n = v->type == kind::dict ? v->dict_size() : v->items.size();
  const char* noun = v->type == kind::dict ? (n == 1 ? "entry" : "entries") : (n == 1 ? "item" : "items");
  std::string out = detail::python_type_of(v);
  if (v->type != kind::object) out += ", " + std::to_string(n) + " " + noun;
  return out + ", " + std::to_string(tensors) + (tensors == 1 ? " tensor" : " tensors") + " inside";
}

void summarize_entries(checkpoint& c, const value* root, const detail::node_marks& tensor_nodes) {
  if (!root || root->type != kind::dict) return;
  auto add_entries = [&](const value* d, value_path prefix) {
    for (size_t i = 0; i < d->dict_size(); ++i) {
      const value* k = d->dict_key(i);
      const value* v = d->dict_value(i);
      if (v == c.state_dict_node || tensor_nodes.contains(v)) continue;
      value_path p = prefix;
      if (k->type == kind::integer)
        p.push_back(k->integer);
      else
        p.push_back(k->type == kind::str ? k->text : pickle::repr(k, 80));
      c.entries.push_back({p, detail::python_type_of(v), entry_value(v, tensor_nodes), v});
    }
  };
  add_entries(root, {});
  // The values of a state dict below the root that are not tensors (a module's
  // _extra_state, a stray int): entries too, or no verb would show them.
  if (c.state_dict && !c.state_dict->empty() && c.state_dict_node && c.state_dict_node->type == kind::dict)
    add_entries(c.state_dict_node, *c.state_dict);
  if (c.lightning) {
    for (size_t i = 0; i < root->dict_size(); ++i) {
      const value* k = root->dict_key(i);
      if (k->type == kind::str && k->text == "hyper_parameters" && root->dict_value(i)->type == kind::dict)
        add_entries(root->dict_value(i), {std::string("hyper_parameters")});
    }
  }
}

void read_torch_zip(checkpoint& c, uint32_t file, const open_options& opt) {
  source_file& f = c.files[file];
  f.zip = zip::archive::open(*f.source, opt.zip_limits);
  const zip::archive& ar = *f.zip;
  // Before the TorchScript test: a torch.export archive has a .data/version record too.
  if (detail::has_pt2_format_record(ar)) return detail::read_pt2(c, file, opt);
  bool torchscript = is_torchscript_archive(ar);
  if (ar.find("model.json"))
    throw_unsupported("legacy TorchScript archive (model.json, PyTorch 1.0-1.2): re-save it with a current PyTorch");
  f.format = torchscript ? file_format::torchscript : file_format::torch_zip;
  const zip::entry* data = ar.find("data.pkl");
  if (!data) {
    if (ar.find("bytecode.pkl"))
      throw_unsupported("mobile (lite interpreter) TorchScript archive without data.pkl");
    throw_unsupported("zip archive without data.pkl: not a PyTorch checkpoint");
  }
  // Without constants.pkl LibTorch cannot load it either; saying so here gives every verb
  // the same answer, with an offset, instead of a loader error from inspect alone.
  if (torchscript && !ar.find("constants.pkl") && !ar.find("bytecode.pkl"))
    if (const zip::entry* code = first_code_record(ar))
      throw_corrupt("record " + std::string(code->name) + " makes this a TorchScript archive, but it has no constants.pkl",
                    code->local_header_offset);
  check_version_record(ar);
  c.byteorder = read_byteorder(ar);
  c.storage_alignment = read_storage_alignment(ar);
  if (opt.verify_crc)
    for (const auto& e : ar.entries()) ar.verify_crc(e);

  f.pickle = parse_record_pickle(ar, *data, opt.pickle_limits, torchscript);
  // Each storage is a record; most tensors have a storage of their own.
  const bool records = opt.intent == open_options::purpose::read;
  if (records) c.storages.reserve(ar.entries().size());
  c.tensors.reserve(ar.entries().size());
  detail::tensor_collector collector(c, detail::zip_storage_binder(c, file, "data/", records),
                                     opt.pickle_limits, opt.max_tensors, false, records);
  collector.collect(*f.pickle);
  collect_globals(c, *f.pickle, torchscript);
  if (!torchscript) c.unknown_records = records_torch_save_never_writes(ar);
  if (torchscript) {
    // constants.pkl holds tensors referenced from code (CONSTANTS.c0, ...); they are part
    // of the file's data, so list them, under a path no module attribute can have.
    if (const zip::entry* consts = ar.find("constants.pkl")) {
      auto doc = parse_record_pickle(ar, *consts, opt.pickle_limits, true);
      size_t first = c.tensors.size(), storages = c.storages.size();
      for (const auto& t : c.tensors)
        if (t.storage) storages = std::max(storages, *t.storage + 1);
      detail::tensor_collector cc(c, detail::zip_storage_binder(c, file, "constants/", records, storages),
                                  opt.pickle_limits, opt.max_tensors, false, records);
      cc.collect(*doc);
      if (records)
        for (size_t i = first; i < c.tensors.size(); ++i)
          c.tensors[i].path.insert(c.tensors[i].path.begin(), std::string("<constants>"));
      for (const value& v : doc->nodes())
        if (v.type == kind::global) {
          std::string full = v.global_name();
          if (std::find(c.globals.begin(), c.globals.end(), full) == c.globals.end()) c.globals.push_back(full);
        }
      std::sort(c.globals.begin(), c.globals.end());
      // Keep the constants' nodes alive with the checkpoint: tensor records point into them.
      f.extra_pickles.push_back(std::move(doc));
    }
  }
}

void read_safetensors(checkpoint& c, uint32_t file, const open_options& opt) {
  source_file& f = c.files[file];
  f.format = file_format::safetensors;
  safetensors::limits lim = opt.safetensors_limits;
  lim.max_tensors = opt.max_tensors;
  f.st_header = safetensors::read_header(*f.source, lim);
  size_t text = 0;
  for (const auto& t : f.st_header->tensors) text += t.name.size();
  c.keys.reserve(c.keys.size() + f.st_header->tensors.size(), text);
  // Grown one push at a time, the two tables were copied ~15 times for 20,000 tensors,
  // and the fresh pages the copies touched were a third of a shard set's inspect.
  c.storages.reserve(c.storages.size() + f.st_header->tensors.size());
  c.tensors.reserve(c.tensors.size() + f.st_header->tensors.size());
  for (const auto& t : f.st_header->tensors) {
    storage_record s;
    s.key = t.name;
    s.type = t.type;
    s.nbytes = t.end - t.begin;
    s.file_offset = t.file_offset;
    s.location = "cpu";
    s.tensor_count = 1;
    s.file = file;
    c.storages.push_back(std::move(s));
    tensor_record r;
    r.path = {t.name};
    r.type = t.type;
    r.shape = t.shape;
    r.stride.assign(t.shape.size(), 1);
    for (size_t i = t.shape.size(); i-- > 1;) r.stride[i - 1] = r.stride[i] * std::max<int64_t>(t.shape[i], 1);
    r.storage = c.storages.size() - 1;
    r.location = "cpu";
    c.keys.add(t.name, c.tensors.size());
    c.tensors.push_back(std::move(r));
  }
  c.state_dict = value_path{};
}

[[noreturn]] void refuse_bare_pickle(const byte_source& src, const open_options& opt, bool certain) {
  std::vector<std::string> seen;
  std::string parse_problem;
  try {
    uint64_t n = std::min<uint64_t>(src.size(), opt.pickle_limits.max_pickle_bytes);
    auto bytes = src.read_vector(0, size_t(n));
    pickle::parse_options po;
    po.lim = opt.pickle_limits;
    po.require_eof = false;
    po.globals_seen = &seen;
    pickle::parse(bytes.data(), bytes.size(), po);
  } catch (const error& e) {
    // A broken pickle is refused all the same; what it imported before the break is the
    // useful part (security.md P5).
    parse_problem = e.message();
  }
  if (!certain && seen.empty() && !parse_problem.empty()) detail::throw_unrecognized(src);
  std::set<std::string> unsafe;
  for (const auto& g : seen)
    if (is_unsafe_global_name(g, false)) unsafe.insert(g);
  std::string msg = "bare pickle stream, not a PyTorch checkpoint (torch.load refuses it; unpickling it can run code)";
  if (!unsafe.empty()) {
    msg += "; unsafe globals: ";
    size_t i = 0;
    for (const auto& g : unsafe) msg += (i++ ? ", " : "") + g;
  }
  if (!parse_problem.empty()) msg += "; the pickle is also malformed: " + parse_problem;
  throw error(errc::unsupported, msg, 0);
}

// The state dict's keys, in the dict's own order, including keys that share one tensor
// object (a tied Parameter saved under two names): the pickle gives both keys one node.
// Entries whose value is no tensor have no key here.
//
// The tensor record of each value: the collector made one record per tensor node, walking
// the dict in its order, so the records usually come in the dict's order and a cursor finds
// them; a map by node (32 MB for a million tensors, at open's peak) is built only when one
// is out of that order (a tied tensor's second key, a state dict below other tensors).
class tensor_index_of_node {
 public:
  tensor_index_of_node(const checkpoint& c, const detail::node_marks& marks) : c_(c), marks_(marks) {}
  const size_t* find(const value* v) {
    if (!marks_.contains(v)) return nullptr;
    if (cursor_ < c_.tensors.size() && c_.tensors[cursor_].node == v) {
      found_ = cursor_++;
      return &found_;
    }
    if (!map_) {
      map_ = std::make_unique<detail::pointer_map<size_t>>(c_.tensors.size());
      for (size_t i = 0; i < c_.tensors.size(); ++i) map_->insert(c_.tensors[i].node, i);
    }
    const size_t* at = map_->find(v);
    if (at) cursor_ = *at + 1;
    return at;
  }
  void restart() { cursor_ = 0; }

 private:
  const checkpoint& c_;
  const detail::node_marks& marks_;
  std::unique_ptr<detail::pointer_map<size_t>> map_;
  size_t cursor_ = 0;
  size_t found_ = 0;
};

void add_state_dict_keys(checkpoint& c, const detail::node_marks& tensor_nodes) {
  const value* d = c.state_dict_node;
  if (!d || d->type != kind::dict) return;
  tensor_index_of_node index_of(c, tensor_nodes);
  size_t keys = 0, text = 0;
  for (size_t i = 0; i < d->dict_size(); ++i)
    if (index_of.find(d->dict_value(i))) {
      ++keys;
      text += d->dict_key(i)->type == kind::str ? d->dict_key(i)->text.size() : 0;
    }
  c.keys.reserve(keys, text);
  index_of.restart();
  for (size_t i = 0; i < d->dict_size(); ++i) {
    const value* k = d->dict_key(i);
    const size_t* index = index_of.find(d->dict_value(i));
    if (!index) continue;
    if (k->type == kind::str)
      c.keys.add(k->text, *index);
    else
      c.keys.add(pickle::repr(k, 80), *index);
  }
}

}  // namespace

const char* format_name(file_format f) {
  switch (f) {
    case file_format::torch_zip: return "torch-zip";
    case file_format::torchscript: return "torchscript";
    case file_format::safetensors: return "safetensors";
    case file_format::torch_legacy: return "torch-legacy";
    case file_format::pt2: return "pt2";
  }
  return "unknown";
}

const char* layout_name(checkpoint_layout l) {
  switch (l) {
    case checkpoint_layout::single_file: return "file";
    case checkpoint_layout::hf_shard_set: return "hf-shard-set";
    case checkpoint_layout::dcp: return "dcp";
  }
  return "unknown";
}

std::string path_to_string(const value_path& path, char separator) {
  std::string out;
  for (const auto& step : path) {
    if (!out.empty()) out += separator;
    if (const auto* s = std::get_if<std::string>(&step))
      out += *s;
    else
      out += std::to_string(std::get<int64_t>(step));
  }
  return out;
}

bool tensor_record::composite() const { return kind && kind->layout != "strided"; }

uint64_t tensor_record::numel() const {
  if (composite()) {
    uint64_t sum = 0;
    for (const auto& part : kind->components)
      if (__builtin_add_overflow(sum, part.second->numel(), &sum)) throw_corrupt("tensor element count overflows");
    return sum;
  }
  uint64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, uint64_t(d < 0 ? 0 : d), &n))
      throw_corrupt("tensor element count overflows");
  return n;
}

uint64_t tensor_record::nbytes() const {
  if (composite()) {
    uint64_t sum = 0;
    for (const auto& part : kind->components) sum += part.second->nbytes();
    return sum;
  }
  const uint64_t n = numel(), per_byte = elements_per_byte(type);
  return per_byte > 1 ? (n + per_byte - 1) / per_byte : n * element_size(type);
}

std::string tensor_kind::description() const {
  if (sparse()) {
    std::string upper = layout.substr(7);
    for (char& ch : upper) ch = char(ch - 'a' + 'A');
    return "sparse " + upper;
  }
  if (layout == "jagged") return "jagged nested";
  if (layout == "strided") return subclass;
  return layout;
}

uint64_t checkpoint::file_size() const {
  uint64_t n = 0;
  for (const auto& f : files)
    if (!f.within) n += f.size;
  return n;
}

uint64_t checkpoint::bytes_read() const {
  uint64_t n = index_bytes_read;
  for (const auto& f : files) n += f.source ? f.source->bytes_read() : 0;
  return n;
}

const source_file& checkpoint::single_file(std::string_view operation) const {
  if (files.size() != 1)
    throw error(errc::unsupported, std::string(operation) + " reads a checkpoint of one file; this one has " +
                                       std::to_string(files.size()))
        .with_file(path);
  return files[0];
}

source_file& checkpoint::single_file(std::string_view operation) {
  return const_cast<source_file&>(std::as_const(*this).single_file(operation));
}

checkpoint open_checkpoint(std::unique_ptr<byte_source> src, const open_options& options) {
  checkpoint c;
  c.path = src->name();
  c.files.emplace_back();
  source_file& f = c.files.back();
  f.path = c.path;
  f.size = src->size();
  f.source = std::move(src);
  try {
    switch (detail::sniff_format(*f.source)) {
      case detail::sniffed::zip:
        read_torch_zip(c, 0, options);
        break;
      case detail::sniffed::legacy_pickle:
        detail::read_legacy(c, 0, options);
        collect_globals(c, *f.pickle, false);
        break;
      case detail::sniffed::safetensors:
        read_safetensors(c, 0, options);
        break;
      case detail::sniffed::bare_pickle:
        refuse_bare_pickle(*f.source, options, true);
      case detail::sniffed::maybe_pickle:
        refuse_bare_pickle(*f.source, options, false);
    }
    c.format = f.format;
    if (c.format != file_format::safetensors && c.format != file_format::torchscript && c.format != file_format::pt2) {
      if (f.pickle) {
        // Which nodes are tensors, asked of every value on the way: made once, a bit a node.
        const detail::node_marks tensor_nodes = tensor_node_set(c, *f.pickle);
        find_state_dict(c, f.pickle->root, tensor_nodes);
        const bool model = options.intent == open_options::purpose::read;
        if (!c.state_dict) detail::find_pickled_module(c, f.pickle.get(), options);
        else if (model) add_state_dict_keys(c, tensor_nodes);
        if (model) summarize_entries(c, f.pickle->root, tensor_nodes);
      } else {
        detail::find_pickled_module(c, nullptr, options);
      }
    }
    c.keys.shrink_to_fit();
    f.tensors = c.tensors.size();
  } catch (error& e) {
    f.source->locate(e);
    throw;
  }
  return c;
}

checkpoint open_checkpoint(const std::string& path, const open_options& options) {
  std::unique_ptr<byte_source> src;
  std::string file;
  try {
    file = resolve_checkpoint_path(path);
    if (const auto [dir, name] = detail::parent_and_name(file); detail::is_shard_index_name(name))
      return detail::open_hf_set(disk_opener(dir), name, options);
  } catch (error& e) {
    e.with_file(path);
    throw;
  }
  // What resolves to a directory is a layout of several files (formats.md §1.1).
  struct stat st;
  if (::stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    const disk_opener fs(file);
    return open_checkpoint("", options, fs);
  }
  try {
    src = std::make_unique<file_source>(file);
  } catch (error& e) {
    e.with_file(path);
    throw;
  }
  return open_checkpoint(std::move(src), options);
}

checkpoint open_checkpoint(const std::string& path, const open_options& options, const file_opener& fs) {
  std::unique_ptr<byte_source> src;
  try {
    const detail::layout l = detail::detect_layout(fs, path);
    if (l.kind == detail::layout_kind::hf_index) return detail::open_hf_set(fs, l.file, options);
    if (l.kind == detail::layout_kind::dcp) return detail::open_dcp(fs, l, options);
    if (l.kind == detail::layout_kind::dcp_safetensors) return detail::open_dcp_safetensors(fs, l, options);
    src = fs.open(l.file);
  } catch (error& e) {
    e.with_file(fs.display(path));
    throw;
  }
  return open_checkpoint(std::move(src), options);
}

std::vector<std::string> checkpoint_input_files(const std::string& path) {
  const std::string file = resolve_checkpoint_path(path);
  struct stat st;
  if (::stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    // A DCP directory: `.metadata` (or the rank-local ones) first (the first one's mode is
    // what outputs copy), then its data files, and Lightning's meta.pt, which the reader
    // also opens.
    const disk_opener fs(file);
    const detail::layout l = detail::detect_layout(fs, "");
    std::vector<std::string> out;
    for (const auto& md : l.metadata) out.push_back(fs.display(md));
    for (const auto& part : l.parts) out.push_back(fs.display(part));
    if (l.kind == detail::layout_kind::dcp && fs.stat("meta.pt").kind == file_kind::regular) out.push_back(fs.display("meta.pt"));
    return out;
  }
  const auto [dir, name] = detail::parent_and_name(file);
  if (!detail::is_shard_index_name(name)) return {file};
  return detail::hf_set_files(disk_opener(dir), name);
}

void release_pickle(checkpoint& c) {
  auto detached = [](const std::shared_ptr<const tensor_record>& t) -> std::shared_ptr<const tensor_record> {
    if (!t) return t;
    auto copy = std::make_shared<tensor_record>(*t);
    copy->node = nullptr;
    return copy;
  };
  for (tensor_record& t : c.tensors) {
    t.node = nullptr;
    if (t.kind && !t.kind->components.empty()) {
      auto k = std::make_shared<tensor_kind>(*t.kind);
      for (auto& part : k->components) part.second = detached(part.second);
      t.kind = std::move(k);
    }
    if (t.quant && (t.quant->scales || t.quant->zero_points)) {
      auto q = std::make_shared<quantization>(*t.quant);
      q->scales = detached(q->scales);
      q->zero_points = detached(q->zero_points);
      t.quant = std::move(q);
    }
  }
  c.state_dict_node = nullptr;
  for (entry_summary& e : c.entries) e.node = nullptr;
  for (source_file& f : c.files) {
    f.extra_pickles.clear();
    f.pickle.reset();
  }
}

void refuse_unsafe_torchscript(const zip::archive& ar, const pickle::limits& lim) {
  const zip::entry* data = ar.find("data.pkl");
  if (!data) return;
  std::vector<std::string> unsafe;
  try {
    auto doc = parse_record_pickle(ar, *data, lim, true);
    std::set<std::string> names;
    for (const value& v : doc->nodes())
      if (v.type == kind::global && is_unsafe_global(v.global_module(), v.global_attr(), true))
        names.insert(v.global_name());
    unsafe.assign(names.begin(), names.end());
  } catch (error& e) {
    // Limits were set by the caller's open_checkpoint; past them, LibTorch judges alone.
    if (e.kind() == errc::limit) return;
    ar.source().locate(e);
    throw;
  }
  if (unsafe.empty()) return;
  std::string names;
  for (size_t i = 0; i < unsafe.size() && i < 8; ++i) names += (i ? ", " : "") + unsafe[i];
  if (unsafe.size() > 8) names += ", ...";
  error e(errc::unsafe,
          "TorchScript archive whose " + std::string(data->name) + " names globals outside TorchScript's own: " + names +
              " (not handed to LibTorch; nothing was imported)",
          data->data_offset);
  throw ar.source().locate(e);
}

}  // namespace ckpt
