#include "formats/legacy_reader.h"

#include <map>
#include <unordered_set>

#include "base/byteio.h"
#include "ckpt/error.h"
#include "formats/tensor_collector.h"

namespace ckpt::detail {
namespace {

using pickle::kind;

// " (torch.uint16)" when the untyped storage `pid` is the first argument of a
// _rebuild_tensor_v3 call naming a dtype, else "".
std::string untyped_dtype_note(const pickle::document& doc, const pickle::value* pid) {
  for (const pickle::value& v : doc.nodes()) {
    if (v.type != kind::object) continue;
    const pickle::value* fn = v.items[pickle::kCallable];
    const pickle::value* args = v.items[pickle::kArgs];
    if (!fn || !fn->is_global("torch._utils", "_rebuild_tensor_v3") || !args || args->type != kind::tuple ||
        args->items.size() < 7 || args->items[0] != pid)
      continue;
    const pickle::value* dt = args->items[6];
    if (dt && dt->type == kind::global && dt->global_module() == "torch")
      return " (torch." + std::string(dt->global_attr()) + ")";
  }
  return "";
}

// Legacy torch.save of a whole model names each nn.Module class it pickles once, as
// ('module', class, source file, source) beside the storages; torch.load returns the class
// (after comparing the source with the class's current code). The class global itself is
// in the tuple, so it is listed with the other globals.
bool is_module_class_pid(const pickle::value& pid_node) {
  const pickle::value* pid = pid_node.items.empty() ? nullptr : pid_node.items[0];
  if (!pid || pid->type != kind::tuple || pid->items.size() != 4 || pid->items[0]->type != kind::str ||
      pid->items[0]->text != "module")
    return false;
  if (pid->items[1]->type != kind::global) throw_corrupt("module persistent id without a class", pid_node.offset);
  return true;
}

struct stream {
  const byte_source& src;
  uint64_t pos = 0;
  pickle::limits lim;

  // Parses the next pickle. Each is read in growing windows, because a pickle's length is
  // only known once its STOP opcode is found.
  std::unique_ptr<pickle::document> next(const char* what) {
    uint64_t window = 1 << 16;
    for (;;) {
      uint64_t avail = src.size() - pos;
      uint64_t n = std::min(window, avail);
      if (n > lim.max_pickle_bytes) n = lim.max_pickle_bytes;
      auto bytes = src.read_vector(pos, size_t(n));
      pickle::parse_options po;
      po.lim = lim;
      po.base_offset = pos;
      po.require_eof = false;
      try {
        auto doc = std::make_unique<pickle::document>(pickle::parse(bytes.data(), bytes.size(), po));
        pos += doc->end_offset;
        return doc;
      } catch (const error& e) {
        // Truncation inside the window: retry with more bytes if the file has them.
        bool can_grow = n < avail && n < lim.max_pickle_bytes;
        if (!can_grow || e.kind() != errc::corrupt) {
          if (e.kind() == errc::corrupt && n == lim.max_pickle_bytes && n < avail)
            throw_limit(std::string(what) + " pickle is larger than the pickle size limit (raise with --max-pickle-bytes)", pos);
          throw;
        }
        window *= 4;
      }
    }
  }
};

}  // namespace

void read_legacy(checkpoint& c, uint32_t file, const open_options& options) {
  source_file& f = c.files[file];
  f.format = file_format::torch_legacy;
  stream s{*f.source, 0, options.pickle_limits};

  // The magic must be the literal 10-byte LONG1 (a computed one is picklescan's
  // pytorch_magic_bypass): sniffing already checked those bytes, so the pickle must be
  // exactly PROTO, LONG1, STOP (15 bytes), at protocols 4 and 5 PROTO, FRAME, LONG1, STOP
  // (24 bytes), or below protocol 2 the LONG text literal and STOP (28 bytes).
  uint8_t head[3] = {};
  f.source->read_exact(0, head, std::min<uint64_t>(sizeof head, f.source->size()));
  const bool framed = head[0] == 0x80 && head[1] >= 4 && head[2] == 0x95;
  auto magic = s.next("magic number");
  if (s.pos != (head[0] == 'L' ? 28u : framed ? 24u : 15u) || !magic->root || magic->root->type != kind::big_integer)
    throw_corrupt("legacy torch file: the magic number is not a plain literal", 0);
  uint64_t at = s.pos;
  auto protocol = s.next("protocol version");
  if (!protocol->root || protocol->root->type != kind::integer || protocol->root->integer != 1001)
    throw_unsupported("legacy torch file: protocol version is not 1001", at);
  at = s.pos;
  auto sys_info = s.next("sys_info");
  const pickle::value* info = sys_info->root;
  if (!info || info->type != kind::dict) throw_corrupt("legacy torch file: sys_info is not a dict", at);
  for (size_t i = 0; i < info->dict_size(); ++i) {
    const auto* k = info->dict_key(i);
    const auto* v = info->dict_value(i);
    if (k->type == kind::str && k->text == "little_endian" && v->type == kind::boolean && !v->flag)
      throw_unsupported("legacy torch file saved on a big-endian machine", at);
  }
  f.pickle = s.next("object");

  // Every storage the object pickle references, by root key: its element type and count.
  struct declared {
    dtype type;
    uint64_t numel;
    uint64_t pid_offset;
  };
  std::map<std::string, declared> by_key;
  for (const pickle::value& v : f.pickle->nodes()) {
    if (v.type != kind::persistent_id || is_module_class_pid(v)) continue;
    storage_ref ref = parse_storage_pid(&v, true);
    // Legacy torch.save writes an UntypedStorage (with the dtype in _rebuild_tensor_v3) for
    // dtypes that have no typed storage class; torch.load's legacy path then fails on
    // UntypedStorage.dtype, so no PyTorch can read the file back.
    if (!ref.typed)
      throw_unsupported("legacy torch file with an untyped storage" + untyped_dtype_note(*f.pickle, &v) +
                            ": legacy torch.save writes it but torch.load cannot read it back; "
                            "save it with the zip format (the default since PyTorch 1.6)",
                        v.offset);
    auto [it, fresh] = by_key.emplace(ref.key, declared{*ref.typed, ref.numel, v.offset});
    if (!fresh && (it->second.type != *ref.typed || it->second.numel != ref.numel))
      throw_corrupt("storage '" + ref.key + "' declared twice with different types or sizes", v.offset);
  }

  at = s.pos;
  auto keys_doc = s.next("storage keys");
  const pickle::value* keys = keys_doc->root;
  if (!keys || keys->type != kind::list) throw_corrupt("legacy torch file: storage key list is not a list", at);
  std::unordered_set<std::string> listed;
  std::map<std::string, size_t> index_of;
  uint64_t pos = s.pos;
  for (const pickle::value* k : keys->items) {
    if (k->type != kind::str) throw_corrupt("legacy torch file: storage key is not a string", k->offset);
    if (!listed.insert(k->text).second) throw_corrupt("legacy torch file: storage key '" + k->text + "' listed twice", k->offset);
    auto d = by_key.find(k->text);
    if (d == by_key.end())
      throw_corrupt("legacy torch file: storage '" + k->text + "' is listed but never referenced", k->offset);
    uint8_t count_bytes[8];
    f.source->read_exact(pos, count_bytes, 8);
    uint64_t count = load_u64(count_bytes);
    if (count != d->second.numel)
      throw_corrupt("storage '" + k->text + "' has " + std::to_string(count) + " elements on disk, " +
                        std::to_string(d->second.numel) + " in the pickle",
                    pos);
    uint64_t nbytes, end;
    if (!checked_mul(count, element_size(d->second.type), &nbytes) || !checked_add(pos + 8, nbytes, &end) ||
        end > f.source->size())
      throw_corrupt("storage '" + k->text + "' runs past the end of the file", pos);
    storage_record rec;
    rec.key = k->text;
    rec.type = d->second.type;
    rec.nbytes = nbytes;
    rec.file_offset = pos + 8;
    rec.file = file;
    c.storages.push_back(std::move(rec));
    index_of[k->text] = c.storages.size() - 1;
    pos = end;
  }
  if (listed.size() != by_key.size())
    throw_corrupt("legacy torch file: a referenced storage is missing from the key list", at);
  if (pos != f.source->size())
    throw_corrupt("legacy torch file: " + std::to_string(f.source->size() - pos) +
                      " unexpected bytes after the last storage",
                  pos);

  tensor_collector collector(
      c,
      [&c, &index_of](const storage_ref& ref, dtype) -> bound_storage {
        size_t i = index_of.at(ref.key);
        if (c.storages[i].location.empty()) c.storages[i].location = ref.location;
        return {i, c.storages[i].nbytes};
      },
      options.pickle_limits, options.max_tensors, true, options.intent == open_options::purpose::read);
  collector.collect(*f.pickle);
}

}  // namespace ckpt::detail
