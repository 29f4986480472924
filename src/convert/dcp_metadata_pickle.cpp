// The `.metadata` of convert --to dcp (formats.md §9.9): the Metadata object PyTorch 2.11's
// FileSystemWriter pickles, built as a value tree and written by our pickle writer.
#include <algorithm>
#include <filesystem>
#include <random>
#include <unordered_map>

#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "ckpt/pickle_writer.h"
#include "convert/dcp_layout.h"
#include "pickle/pickle_builder.h"

namespace ckpt::detail {
namespace {

using pickle::kind;
using pickle::value;

const char* kDcpModule = "torch.distributed.checkpoint.metadata";

// StorageMeta.save_id: a random UUID (version 4), as uuid.uuid4() gives.
std::string uuid4() {
  std::random_device rd;
  uint8_t u[16];
  for (auto& x : u) x = uint8_t(rd());
  u[6] = uint8_t((u[6] & 0x0F) | 0x40);
  u[8] = uint8_t((u[8] & 0x3F) | 0x80);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[u[i] >> 4];
    s += hex[u[i] & 15];
  }
  return s;
}

// The `.metadata` pickle, node for node what pickle.dump(Metadata) gives under torch 2.11
// (formats.md §9.2, §9.9): dataclasses as NEWOBJ + BUILD of their __dict__,
// TensorProperties with its 5-tuple, torch.Size and the enum as REDUCE, dtypes as globals.
// One object where CPython has one (each key's str, the layout, the memory format, the
// field names it interns), so the memo shares them as in PyTorch's file.
class metadata_builder {
 public:
  value* none() { return b_.doc.make(kind::none, 0); }
  value* field(const std::string& name) {
    value*& v = fields_[name];
    if (!v) v = b_.str(name);
    return v;
  }
  value* instance(const char* module, const char* cls, value* state) {
    value* o = b_.doc.make(kind::object, 0);
    o->op = pickle::object_op::newobj;
    o->items.assign(pickle::kObjectSlots, nullptr);
    o->items[pickle::kCallable] = b_.global(module, cls);
    o->items[pickle::kArgs] = b_.tuple({});
    o->state = state;
    return o;
  }
  value* dict(std::vector<std::pair<value*, value*>> kv) {
    value* d = b_.doc.make(kind::dict, 0);
    std::vector<value*> items;
    for (auto& [k, v] : kv) {
      items.push_back(k);
      items.push_back(v);
    }
    d->items = items;
    return d;
  }
  value* size(const std::vector<int64_t>& dims) {
    return b_.call(b_.global("torch", "Size"), b_.tuple({b_.ints(dims)}));
  }
  value* properties(dtype type) {
    if (!layout_) {
      layout_ = b_.call(b_.global("torch.serialization", "_get_layout"), b_.tuple({b_.str("torch.strided")}));
      memory_format_ = b_.call(b_.global(kDcpModule, "_MEM_FORMAT_ENCODING"), b_.tuple({b_.integer(0)}));
    }
    return instance(kDcpModule, "TensorProperties",
                    b_.tuple({b_.global("torch", name(type)), layout_, b_.boolean(false), memory_format_,
                              b_.boolean(false)}));
  }
  value* list(std::vector<value*> items) {
    value* l = b_.doc.make(kind::list, 0);
    l->items = items;
    return l;
  }
  pickle::builder& b() { return b_; }

 private:
  pickle::builder b_;
  std::unordered_map<std::string, value*> fields_;
  value* layout_ = nullptr;
  value* memory_format_ = nullptr;
};

// The planner_data path of a tensor: a DCP input's own path for a key kept as it was (so
// dcp_to_torch_save nests it as before), else the one-element path dcp.save gives a key of
// a flat state dict.
value_path planner_path_of(const checkpoint& c, const convert_tensor& t) {
  if (c.layout != checkpoint_layout::dcp || t.name != t.source_key) return {t.name};
  size_t record = 0;
  if (t.record)
    record = *t.record;
  else if (c.keys.piece_count(*t.assembled))
    record = c.keys.piece(*t.assembled, 0).tensor;
  else
    return {t.name};
  const value_path& p = c.tensors.at(record).path;
  return p.empty() ? value_path{t.name} : p;
}

std::vector<uint8_t> build_pickle(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                                     const std::vector<item_place>& places, const std::vector<item_place>& byte_places,
                                     const std::string& checkpoint_id) {
  metadata_builder m;
  pickle::builder& b = m.b();
  std::vector<value*> key_node(plan.tensors.size());
  for (size_t i = 0; i < plan.tensors.size(); ++i) key_node[i] = b.str(plan.tensors[i].name);
  std::vector<value*> byte_node;
  for (const auto& it : plan.byte_items) byte_node.push_back(b.str(it.name));
  // A value_path as planner_data's tuple; an element spelling the key is the key's node.
  auto path_tuple = [&](const value_path& p, const std::string& name, value* node) {
    std::vector<value*> path;
    for (const path_element& e : p) {
      if (const auto* s = std::get_if<std::string>(&e))
        path.push_back(*s == name ? node : b.str(*s));
      else
        path.push_back(b.integer(std::get<int64_t>(e)));
    }
    return b.tuple(path);
  };

  std::vector<std::pair<value*, value*>> sdm;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const convert_tensor& t = plan.tensors[i];
    std::vector<value*> chunks;
    for (size_t k : layout.chunks[i]) {
      const band& bd = layout.bands[k];
      chunks.push_back(m.instance(kDcpModule, "ChunkStorageMetadata",
                                  m.dict({{m.field("offsets"), m.size(bd.offsets)}, {m.field("sizes"), m.size(bd.sizes)}})));
    }
    sdm.emplace_back(key_node[i], m.instance(kDcpModule, "TensorStorageMetadata",
                                             m.dict({{m.field("properties"), m.properties(t.type)},
                                                     {m.field("size"), m.size(t.shape)},
                                                     {m.field("chunks"), m.list(chunks)}})));
  }
  for (size_t i = 0; i < plan.byte_items.size(); ++i)
    sdm.emplace_back(byte_node[i], m.instance(kDcpModule, "BytesStorageMetadata", nullptr));

  std::vector<std::pair<value*, value*>> planner;
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    planner.emplace_back(key_node[i], path_tuple(planner_path_of(c, plan.tensors[i]), plan.tensors[i].name, key_node[i]));
  for (size_t i = 0; i < plan.byte_items.size(); ++i)
    planner.emplace_back(byte_node[i], path_tuple(plan.byte_items[i].path, plan.byte_items[i].name, byte_node[i]));

  std::vector<std::pair<value*, value*>> storage;
  std::vector<value*> file_node;
  for (uint32_t r = 0; r < layout.items.size(); ++r) file_node.push_back(b.str(data_file_name(r)));
  for (uint32_t r = 0; r < layout.items.size(); ++r) {
    // FileSystemWriter writes a rank's BYTE_IO items first; ours are all rank 0's.
    for (size_t i = 0; r == 0 && i < plan.byte_items.size(); ++i) {
      const convert_byte_item& it = plan.byte_items[i];
      value* mi = m.instance(kDcpModule, "MetadataIndex",
                             m.dict({{m.field("fqn"), byte_node[i]}, {m.field("index"), m.none()}}));
      std::vector<std::pair<value*, value*>> info = {{m.field("relative_path"), file_node[r]},
                                                     {m.field("offset"), b.integer(int64_t(byte_places[i].offset))},
                                                     {m.field("length"), b.integer(int64_t(byte_places[i].length))}};
      // _StorageInfo.__getstate__ leaves transform_descriptors out when there are none.
      if (!it.transforms.empty()) {
        std::vector<value*> ds;
        for (const auto& d : it.transforms) ds.push_back(b.str(d));
        info.emplace_back(m.field("transform_descriptors"), m.list(ds));
      }
      storage.emplace_back(mi, m.instance("torch.distributed.checkpoint.filesystem", "_StorageInfo", m.dict(info)));
    }
    for (size_t k : layout.items[r]) {
      const band& bd = layout.bands[k];
      const auto& chunks = layout.chunks[bd.tensor];
      const int64_t index = std::find(chunks.begin(), chunks.end(), k) - chunks.begin();
      value* mi = m.instance(kDcpModule, "MetadataIndex",
                             m.dict({{m.field("fqn"), key_node[bd.tensor]},
                                     {m.field("index"), b.integer(index)},
                                     {m.field("offset"), m.size(bd.offsets)}}));
      value* si = m.instance("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                             m.dict({{m.field("relative_path"), file_node[r]},
                                     {m.field("offset"), b.integer(int64_t(places[k].offset))},
                                     {m.field("length"), b.integer(int64_t(places[k].length))}}));
      storage.emplace_back(mi, si);
    }
  }

  // checkpoint_id: FileSystemWriter keeps the pathlib.Path it was given; under Python 3.11
  // (the venv's) a PosixPath pickles as REDUCE(PosixPath, parts).
  std::vector<value*> parts;
  const std::filesystem::path id(checkpoint_id);
  for (const auto& part : id) parts.push_back(b.str(part.string()));
  value* checkpoint_path = b.call(b.global("pathlib", "PosixPath"), b.tuple(parts));
  value* storage_meta = m.instance(kDcpModule, "StorageMeta",
                                   m.dict({{m.field("checkpoint_id"), checkpoint_path},
                                           {m.field("save_id"), b.str(uuid4())},
                                           {m.field("load_id"), m.none()},
                                           {m.field("modules"), m.list({})}}));
  b.doc.root = m.instance(kDcpModule, "Metadata",
                          m.dict({{m.field("state_dict_metadata"), m.dict(sdm)},
                                  {m.field("planner_data"), m.dict(planner)},
                                  {m.field("storage_data"), m.dict(storage)},
                                  {m.field("storage_meta"), storage_meta},
                                  {m.field("version"), b.str("1.0.0")}}));
  return pickle::write(b.doc.root, 2, &b.doc);
}

// The bytes written must read back, under the reader's own checks (§9.4), as the plan.
void check_reads_back(const std::vector<uint8_t>& bytes, const convert_plan& plan, const dcp_layout& layout) {
  const dcp::metadata md = dcp::decode_metadata(bytes.data(), bytes.size());
  dcp::check_metadata(md);
  const size_t items = plan.tensors.size() + plan.byte_items.size();
  if (md.items.size() != items || md.storage_data.size() != layout.bands.size() + plan.byte_items.size())
    throw error(errc::io, "the new .metadata does not read back with the planned items (internal error; nothing written)");
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    if (md.items[i].fqn != plan.tensors[i].name || !md.items[i].is_tensor ||
        md.items[i].tensor.chunks.size() != layout.chunks[i].size())
      throw error(errc::io, "the new .metadata does not read back item '" + plan.tensors[i].name +
                                "' as planned (internal error; nothing written)");
}

}  // namespace

std::vector<uint8_t> dcp_metadata_pickle(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                                         const std::vector<item_place>& places,
                                         const std::vector<item_place>& byte_places, const std::string& checkpoint_id) {
  std::vector<uint8_t> bytes = build_pickle(c, plan, layout, places, byte_places, checkpoint_id);
  check_reads_back(bytes, plan, layout);
  return bytes;
}

}  // namespace ckpt::detail
