// The DCP `.metadata` decoder (docs/formats.md §9.2): pickle::parse, then a walk that
// accepts only the shapes PyTorch 2.4-2.11's dataclasses pickle to. Dataclass instances
// arrive as NEWOBJ(cls, ()) + BUILD(state); torch.Size as REDUCE(torch.Size, (tuple,));
// dtypes as bare globals. Any other shape is corrupt, never guessed at. PyTorch itself reads
// this file with plain pickle.load (security.md P13).
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "formats/dcp_metadata_decoders.h"
#include "pickle/pickle_accessors.h"
#include "base/text.h"

namespace ckpt::dcp {
namespace {

using pickle::kind;
using pickle::value;
using ckpt::detail::bad;

constexpr std::string_view kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr std::string_view kFilesystemModule = "torch.distributed.checkpoint.filesystem";

// The words that name a value in an error ("state_dict_metadata['w'].chunks[3].offsets"),
// kept as a chain of parts and joined only when a check fails: a .metadata of 80,000 chunks
// would otherwise build half a million strings that no error ever prints. A where points
// at its parent, so it lives no longer than the expression or scope that made it.
class where {
 public:
  where(const char* text) : text_(text) {}          // NOLINT(google-explicit-constructor)
  where(const std::string& text) : text_(text) {}   // NOLINT(google-explicit-constructor)
  where(const where& parent, std::string_view text) : parent_(&parent), text_(text) {}
  // parent + text + "['key']"
  static where keyed(std::string_view text, std::string_view key) {
    where w{text};
    w.key_ = key;
    w.form_ = form::key;
    return w;
  }
  // parent + text + "[i]"
  static where indexed(const where& parent, std::string_view text, size_t i) {
    where w(parent, text);
    w.index_ = i;
    w.form_ = form::index;
    return w;
  }

  std::string str() const {
    std::string s = parent_ ? parent_->str() : std::string();
    s += text_;
    if (form_ == form::key) s += "[" + text::in_quotes(key_) + "]";
    if (form_ == form::index) s += "[" + std::to_string(index_) + "]";
    return s;
  }
  friend std::string operator+(const where& w, std::string_view tail) { return w.str() + std::string(tail); }

 private:
  explicit where(std::string_view text) : text_(text) {}
  enum class form { plain, key, index };
  const where* parent_ = nullptr;
  std::string_view text_;
  form form_ = form::plain;
  std::string_view key_;
  size_t index_ = 0;
};

// An instance of `module.cls`, as the pickle machine records NEWOBJ / REDUCE calls.
bool is_instance(const value* v, std::string_view module, std::string_view cls) {
  if (!v || v->type != kind::object) return false;
  const value* g = v->callable_global();
  return g && g->is_global(module, cls);
}

const value* expect_instance(const value* v, std::string_view module, std::string_view cls, const where& what) {
  if (!is_instance(v, module, cls))
    bad(v, what + " must be a " + std::string(cls) + " (got " + pickle::repr(v, 80) + ")");
  return v;
}

// The state BUILD gave a dataclass instance: the instance's __dict__.
const value* state_dict(const value* obj, const where& what) {
  const value* s = obj->state;
  if (!s || s->type != kind::dict) bad(obj, what + ": its state must be a dict of fields");
  return s;
}

// A field of a dataclass state dict, or nullptr when absent. Later writes of the same key
// replace earlier ones in the pickle machine's dicts, as in Python's.
const value* field(const value* state, std::string_view name) { return ckpt::detail::str_key(state, name); }

const value* required(const value* state, std::string_view name, const where& what) {
  const value* v = field(state, name);
  if (!v) bad(state, what + ": field '" + std::string(name) + "' is missing");
  return v;
}

// detail::as_int and as_bool, with the name built only for the error.
int64_t integer(const value* v, const where& what) {
  if (v->type == kind::integer) return v->integer;
  if (v->type == kind::boolean) return v->flag ? 1 : 0;
  bad(v, what + " must be an integer");
}

bool as_flag(const value* v, const where& what) {
  if (v->type == kind::boolean) return v->flag;
  if (v->type == kind::integer && (v->integer == 0 || v->integer == 1)) return v->integer == 1;
  bad(v, what + " must be a bool");
}

int64_t nonnegative(const value* v, const where& what) {
  if (v->type == kind::big_integer) bad(v, what + " is out of range");
  int64_t x = integer(v, what);
  if (x < 0) bad(v, what + " is negative (" + std::to_string(x) + ")");
  return x;
}

// torch.Size((d0, d1, ...)): REDUCE(torch.Size, (tuple,)).
std::vector<int64_t> as_size(const value* v, const where& what, bool allow_negative = false) {
  if (!is_instance(v, "torch", "Size")) bad(v, what + " must be a torch.Size (got " + pickle::repr(v, 80) + ")");
  const value* args = v->items[pickle::kArgs];
  const value* dims = args && args->type == kind::tuple && args->items.size() == 1 ? args->items[0] : nullptr;
  if (!dims || (dims->type != kind::tuple && dims->type != kind::list))
    bad(v, what + ": torch.Size must be called with one tuple of ints");
  if (dims->items.size() > 64) bad(v, what + ": " + std::to_string(dims->items.size()) + " dimensions (at most 64)");
  std::vector<int64_t> out;
  out.reserve(dims->items.size());
  for (const value* d : dims->items)
    out.push_back(allow_negative ? integer(d, what) : nonnegative(d, where(what, " element")));
  return out;
}

std::string as_string(const value* v, const where& what) {
  if (v->type != kind::str) bad(v, what + " must be a string (got " + pickle::repr(v, 60) + ")");
  return std::string(v->text);
}

std::optional<std::string> as_optional_string(const value* v, const where& what) {
  if (!v || v->type == kind::none) return std::nullopt;
  return as_string(v, what);
}

// TensorProperties pickles through __getstate__/__setstate__ as the 5-tuple (dtype, layout,
// requires_grad, memory_format, pin_memory), which __setstate__ unpacks exactly
// (metadata.py:57-100): any other state fails under PyTorch, so it is corrupt here too.
void decode_properties(const value* v, tensor_meta& t, const where& what) {
  expect_instance(v, kMetadataModule, "TensorProperties", what);
  const value* s = v->state;
  if (!s || s->type != kind::tuple || s->items.size() != 5)
    bad(s ? s : v, what + ": TensorProperties state must be a 5-tuple");
  const value* dt = s->items[0];
  const value* layout = s->items[1];
  const value* grad = s->items[2];
  const value* mem = s->items[3];
  const value* pin = s->items[4];
  if (dt->type != kind::global || dt->global_module() != "torch")
    bad(dt, what + ": dtype must be a torch dtype (got " + pickle::repr(dt, 60) + ")");
  std::optional<dtype> d = dtype_from_name(dt->global_attr());
  if (!d || dt->global_attr().find('.') != std::string_view::npos)
    throw_unsupported(what + ": dtype torch." + std::string(dt->global_attr()) + " is not supported", dt->offset);
  t.type = *d;
  if (layout->type != kind::none) {
    // copyreg's reduction of torch.layout: torch.serialization._get_layout('torch.strided').
    if (!is_instance(layout, "torch.serialization", "_get_layout")) bad(layout, what + ": layout must be a torch.layout");
    const value* a = layout->items[pickle::kArgs];
    if (!a || a->type != kind::tuple || a->items.size() != 1) bad(layout, what + ": _get_layout takes one string");
    t.layout = as_string(a->items[0], where(what, " layout"));
    // A sparse or mkldnn layout is no box of dense elements: refuse rather than misread it.
    if (t.layout != "torch.strided")
      throw_unsupported(what + ": layout " + t.layout + " is not supported (only torch.strided)", layout->offset);
  }
  if (grad->type != kind::none) t.requires_grad = as_flag(grad, where(what, " requires_grad"));
  if (pin->type != kind::none) t.pin_memory = as_flag(pin, where(what, " pin_memory"));
  // __setstate__ raises on anything but the three encodings.
  if (!is_instance(mem, kMetadataModule, "_MEM_FORMAT_ENCODING"))
    bad(mem, what + ": memory_format must be a _MEM_FORMAT_ENCODING");
  const value* a = mem->items[pickle::kArgs];
  if (!a || a->type != kind::tuple || a->items.size() != 1) bad(mem, what + ": _MEM_FORMAT_ENCODING takes one int");
  t.memory_format = integer(a->items[0], "memory format");
  if (t.memory_format < 0 || t.memory_format > 2)
    bad(mem, what + ": memory format " + std::to_string(t.memory_format) + " is not one of 0, 1, 2");
}

item decode_item(const value* key, const value* v) {
  item it;
  it.fqn = as_string(key, "a state_dict_metadata key");
  it.at = v->offset;
  const where what = where::keyed("state_dict_metadata", it.fqn);
  if (is_instance(v, kMetadataModule, "BytesStorageMetadata")) return it;
  expect_instance(v, kMetadataModule, "TensorStorageMetadata", what);
  it.is_tensor = true;
  const value* s = state_dict(v, what);
  decode_properties(required(s, "properties", what), it.tensor, where(what, ".properties"));
  it.tensor.size = as_size(required(s, "size", what), where(what, ".size"));
  const value* chunks = required(s, "chunks", what);
  if (chunks->type != kind::list) bad(chunks, what + ".chunks must be a list");
  it.tensor.chunks.reserve(chunks->items.size());
  for (size_t i = 0; i < chunks->items.size(); ++i) {
    const value* c = chunks->items[i];
    const where cw = where::indexed(what, ".chunks", i);
    expect_instance(c, kMetadataModule, "ChunkStorageMetadata", cw);
    const value* cs = state_dict(c, cw);
    chunk ch;
    ch.at = c->offset;
    // Offsets may be negative in a hostile file: the coverage check names such a box.
    ch.offsets = as_size(required(cs, "offsets", cw), where(cw, ".offsets"), true);
    ch.sizes = as_size(required(cs, "sizes", cw), where(cw, ".sizes"));
    if (ch.offsets.size() != it.tensor.size.size() || ch.sizes.size() != it.tensor.size.size())
      bad(c, cw + ": box of rank " + std::to_string(ch.offsets.size()) + "/" + std::to_string(ch.sizes.size()) +
                 " in a tensor of rank " + std::to_string(it.tensor.size.size()));
    it.tensor.chunks.push_back(std::move(ch));
  }
  return it;
}

// A relative_path that could leave the checkpoint directory is no DCP writer's output.
// The rule is file_opener's, the one every name read from a file goes through.
void check_relative_path(const value* v, const std::string& p, const where& what) {
  if (!relative_name_problem(p).empty())
    bad(v, what + ": relative_path " + text::in_quotes(p) + " is not a file name inside the checkpoint directory");
}

storage_item decode_storage(const value* key, const value* v) {
  storage_item si;
  si.at = key->offset;
  expect_instance(key, kMetadataModule, "MetadataIndex", "a storage_data key");
  const value* ks = state_dict(key, "MetadataIndex");
  si.fqn = as_string(required(ks, "fqn", "MetadataIndex"), "MetadataIndex.fqn");
  const where what = where::keyed("storage_data", si.fqn);
  // MetadataIndex.__init__ sets offset only when given (BYTE_IO items have none).
  const value* off = field(ks, "offset");
  if (off && off->type != kind::none) si.offsets = as_size(off, where(what, " offset"), true);
  const value* idx = field(ks, "index");
  if (idx && idx->type != kind::none) si.index = integer(idx, "MetadataIndex.index");

  expect_instance(v, kFilesystemModule, "_StorageInfo", what);
  const value* s = state_dict(v, what);
  si.relative_path = as_string(required(s, "relative_path", what), where(what, ".relative_path"));
  check_relative_path(v, si.relative_path, what);
  si.offset = uint64_t(nonnegative(required(s, "offset", what), where(what, ".offset")));
  si.length = uint64_t(nonnegative(required(s, "length", what), where(what, ".length")));
  if (si.offset + si.length < si.offset) bad(v, what + ": byte range overflows");
  // Absent before 2.7, and omitted by __getstate__ when None.
  const value* td = field(s, "transform_descriptors");
  if (td && td->type != kind::none) {
    if (td->type != kind::list && td->type != kind::tuple) bad(td, what + ".transform_descriptors must be a list");
    for (const value* d : td->items)
      si.transform_descriptors.push_back(as_string(d, where(what, " transform descriptor")));
  }
  return si;
}

void decode_planner_data(const value* v, metadata& md) {
  if (!v || v->type == kind::none) return;
  md.has_planner_data = true;
  // DefaultSavePlanner's form: {fqn: (str | int, ...)}. Anything else is a custom
  // planner's business; keep it opaque instead of failing or half-reading it.
  bool paths = v->type == kind::dict;
  for (size_t i = 0; paths && i < v->dict_size(); ++i) {
    const value* k = v->dict_key(i);
    const value* p = v->dict_value(i);
    if (k->type != kind::str || (p->type != kind::tuple && p->type != kind::list)) paths = false;
    for (size_t j = 0; paths && j < p->items.size(); ++j) {
      kind t = p->items[j]->type;
      if (t != kind::str && t != kind::integer) paths = false;
    }
  }
  if (!paths) {
    md.planner_data_opaque = true;
    return;
  }
  md.planner_data.reserve(v->dict_size());
  for (size_t i = 0; i < v->dict_size(); ++i) {
    planner_path pp;
    pp.fqn = std::string(v->dict_key(i)->text);
    for (const value* e : v->dict_value(i)->items) {
      path_element pe;
      if (e->type == kind::integer) {
        pe.is_index = true;
        pe.index = e->integer;
      } else {
        pe.key = std::string(e->text);
      }
      pp.path.push_back(std::move(pe));
    }
    md.planner_data.push_back(std::move(pp));
  }
}

// StorageMeta.checkpoint_id: a str (FsspecWriter) or the pathlib path FileSystemWriter
// held: PosixPath('/', 'tmp', 'x') up to Python 3.12, PosixPath('/tmp/x') from 3.13.
std::string decode_checkpoint_id(const value* v) {
  if (!v || v->type == kind::none) return "";
  if (v->type == kind::str) return std::string(v->text);
  const value* g = v->type == kind::object ? v->callable_global() : nullptr;
  if (!g || (g->global_module() != "pathlib" && g->global_module() != "pathlib._local"))
    bad(v, "StorageMeta.checkpoint_id must be a str or a pathlib path");
  const value* a = v->items[pickle::kArgs];
  if (!a || a->type != kind::tuple) bad(v, "StorageMeta.checkpoint_id: a path takes string parts");
  std::string out;
  for (const value* part : a->items) {
    std::string s = as_string(part, "StorageMeta.checkpoint_id part");
    if (!out.empty() && out.back() != '/') out += '/';
    out += s;
  }
  return out;
}

std::optional<storage_meta> decode_storage_meta(const value* v) {
  if (!v || v->type == kind::none) return std::nullopt;
  expect_instance(v, kMetadataModule, "StorageMeta", "Metadata.storage_meta");
  const value* s = state_dict(v, "StorageMeta");
  storage_meta sm;
  sm.checkpoint_id = decode_checkpoint_id(field(s, "checkpoint_id"));
  sm.save_id = as_optional_string(field(s, "save_id"), "StorageMeta.save_id").value_or("");
  sm.load_id = as_optional_string(field(s, "load_id"), "StorageMeta.load_id");
  if (const value* m = field(s, "modules"); m && m->type != kind::none) {
    if (m->type != kind::list) bad(m, "StorageMeta.modules must be a list");
    for (const value* e : m->items) sm.modules.push_back(as_string(e, "StorageMeta.modules element"));
  }
  return sm;
}

std::vector<std::string> unsafe_among(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& full : names) {
    std::string_view f = full;
    size_t dot = f.rfind('.');
    if (dot == std::string_view::npos || !is_dcp_global(f.substr(0, dot), f.substr(dot + 1))) out.push_back(full);
  }
  return out;
}

}  // namespace

namespace detail {

metadata decode_metadata_tree(const uint8_t* data, size_t size, const decode_options& options) {
  pickle::parse_options po;
  po.lim = options.lim;
  std::vector<std::string> seen;
  po.globals_seen = &seen;
  pickle::document doc;
  try {
    doc = pickle::parse(data, size, po);
  } catch (const error& broken) {
    // pickle.load would already have imported (and maybe run) what came before the break.
    std::set<std::string> names(seen.begin(), seen.end());
    std::vector<std::string> unsafe = unsafe_among({names.begin(), names.end()});
    if (unsafe.empty()) throw;
    throw error(broken.kind(), broken.message() + " (before it, the pickle named globals outside the DCP vocabulary: " +
                                   text::join_names(unsafe) + ")",
                broken.offset());
  }

  metadata md;
  md.protocol = doc.protocol;
  std::set<std::string> names;
  for (const value& v : doc.nodes())
    if (v.type == kind::global) names.insert(v.global_name());
  md.globals.assign(names.begin(), names.end());
  // Checked before the shape of anything: every node counts, reachable or not, since a
  // global that was called and popped still ran under pickle.load (security.md P5).
  if (std::vector<std::string> unsafe = unsafe_among(md.globals); !unsafe.empty())
    throw error(errc::unsafe, "the .metadata pickle names globals outside the DCP vocabulary, which "
                              "pickle.load (what torch.distributed.checkpoint uses) would import and run: " +
                                  text::join_names(unsafe));

  const value* root = doc.root;
  expect_instance(root, kMetadataModule, "Metadata", "the .metadata pickle");
  const value* s = state_dict(root, "Metadata");
  static constexpr std::string_view kKnown[] = {"state_dict_metadata", "planner_data", "storage_data",
                                                "storage_meta", "version"};
  for (size_t i = 0; i < s->dict_size(); ++i) {
    const value* k = s->dict_key(i);
    std::string name = k->type == kind::str ? std::string(k->text) : pickle::repr(k, 60);
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown)) md.unknown_fields.push_back(name);
  }

  const value* sdm = required(s, "state_dict_metadata", "Metadata");
  if (sdm->type != kind::dict) bad(sdm, "Metadata.state_dict_metadata must be a dict");
  md.items.reserve(sdm->dict_size());
  for (size_t i = 0; i < sdm->dict_size(); ++i) md.items.push_back(decode_item(sdm->dict_key(i), sdm->dict_value(i)));

  // storage_data is None only in a Metadata built by hand; a loader could not find a byte.
  const value* sd = required(s, "storage_data", "Metadata");
  if (sd->type != kind::dict) bad(sd, "Metadata.storage_data must be a dict");
  md.storage_data.reserve(sd->dict_size());
  for (size_t i = 0; i < sd->dict_size(); ++i) md.storage_data.push_back(decode_storage(sd->dict_key(i), sd->dict_value(i)));

  decode_planner_data(field(s, "planner_data"), md);
  md.writer_meta = decode_storage_meta(field(s, "storage_meta"));
  md.version = as_optional_string(field(s, "version"), "Metadata.version");
  return md;
}

}  // namespace detail

// The one-pass decoder takes what PyTorch writes; anything else, and every error, is the
// tree decoder's (docs/formats.md §9.11).
metadata decode_metadata(const uint8_t* data, size_t size, const decode_options& options) {
  metadata md;
  if (detail::decode_metadata_stream(data, size, options, &md)) return md;
  return detail::decode_metadata_tree(data, size, options);
}

metadata decode_metadata(const byte_source& src, const decode_options& options) {
  try {
    if (src.size() > options.lim.max_pickle_bytes)
      throw_limit("the .metadata pickle is " + std::to_string(src.size()) +
                  " bytes, over the pickle size limit (raise with --max-pickle-bytes)");
    // Not zeroed first (a vector would be): 17 MB of memset for a DCP of 80,000 chunks.
    const size_t n = size_t(src.size());
    std::unique_ptr<uint8_t[]> bytes(new uint8_t[n ? n : 1]);
    src.read_exact(0, bytes.get(), n);
    return decode_metadata(bytes.get(), n, options);
  } catch (error& e) {
    e.with_file(src.name());
    throw;
  }
}

}  // namespace ckpt::dcp
