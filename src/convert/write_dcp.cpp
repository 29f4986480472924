// convert --to dcp (formats.md §9.9): a torch.distributed.checkpoint directory as
// FileSystemWriter writes it for K ranks that held every tensor as a DTensor sharded on
// dimension 0 (Shard(0)): `__{r}_0.distcp` per rank, each a run of torch.save archives
// (one per chunk), and `.metadata` last, the pickle torch 2.11's FileSystemWriter writes.
// Each band is gathered alone (or copied straight from the input when it is one range of
// it), so a tensor of several bands never passes through memory whole.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <unordered_map>

#include "ckpt/convert.h"
#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "ckpt/pickle_writer.h"
#include "ckpt/zip_writer.h"
#include "convert/tensor_bytes.h"
#include "pickle/pickle_builder.h"

namespace ckpt {
namespace {

using pickle::kind;
using pickle::value;

const char* kMetadataName = ".metadata";
const char* kDcpModule = "torch.distributed.checkpoint.metadata";

// One chunk of the output: rows [row0, row0 + rows) of tensor `tensor`, saved by `rank`.
struct band {
  size_t tensor = 0;
  int64_t row0 = 0, rows = 0;
  uint32_t rank = 0;
  uint64_t nbytes = 0;  // as written
  std::vector<int64_t> offsets, sizes;  // the box in global coordinates
};

struct dcp_layout {
  std::vector<band> bands;
  std::vector<std::vector<size_t>> chunks;  // by tensor: its bands, in chunk order
  std::vector<std::vector<size_t>> items;   // by rank: its bands, in file order
};

std::string data_file_name(uint32_t rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

// Shard(0) over `ranks` (DTensor's Shard.local_shard_size_and_offset): ceil(n / K) rows per
// rank, the trailing ranks fewer or none (an empty box at offset n). Boxes at the same
// offset are one item to DCP (its MetadataIndex is (fqn, offset)): the first rank's is kept,
// as _dedup_save_plans keeps one. A 0-dim tensor cannot be split: like a replicated tensor
// after deduplication it goes to the rank with the fewest bytes so far (the lowest on a tie).
dcp_layout lay_out(const convert_plan& plan, uint32_t ranks) {
  dcp_layout out;
  out.chunks.resize(plan.tensors.size());
  out.items.resize(ranks);
  std::vector<uint64_t> load(ranks, 0);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const convert_tensor& t = plan.tensors[i];
    const uint64_t row_bytes = t.shape.empty() ? t.nbytes : (t.shape[0] ? t.nbytes / uint64_t(t.shape[0]) : 0);
    auto add = [&](int64_t row0, int64_t rows, uint32_t rank) {
      band b;
      b.tensor = i;
      b.row0 = row0;
      b.rows = rows;
      b.rank = rank;
      b.nbytes = t.shape.empty() ? t.nbytes : uint64_t(rows) * row_bytes;
      b.offsets.assign(t.shape.size(), 0);
      b.sizes = t.shape;
      if (!t.shape.empty()) {
        b.offsets[0] = row0;
        b.sizes[0] = rows;
      }
      out.chunks[i].push_back(out.bands.size());
      out.items[rank].push_back(out.bands.size());
      load[rank] += b.nbytes;
      out.bands.push_back(std::move(b));
    };
    if (t.shape.empty()) {
      add(0, 1, uint32_t(std::min_element(load.begin(), load.end()) - load.begin()));
      continue;
    }
    const int64_t n = t.shape[0];
    const int64_t per = n / int64_t(ranks) + (n % int64_t(ranks) != 0);
    std::vector<int64_t> taken;
    for (uint32_t r = 0; r < ranks; ++r) {
      const int64_t start = per * int64_t(r);
      const int64_t row0 = std::min(start, n), rows = start >= n ? 0 : std::min(per, n - start);
      if (std::find(taken.begin(), taken.end(), row0) != taken.end()) continue;
      taken.push_back(row0);
      add(row0, rows, r);
    }
  }
  return out;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    stride[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return stride;
}

// data.pkl of torch.save(chunk): the tensor itself at the root (formats.md §9.3), its storage
// "0" holding exactly its elements.
std::vector<uint8_t> chunk_pickle(dtype type, const std::vector<int64_t>& shape, uint64_t nbytes) {
  pickle::builder b;
  const dtype_info& di = info(type);
  const bool typed = di.legacy_storage != nullptr;
  const uint64_t count = typed ? nbytes / di.element_size : nbytes;
  value* pid = b.doc.make(kind::persistent_id, 0);
  pid->items = {b.tuple({b.str("storage"),
                         typed ? b.global("torch", di.legacy_storage) : b.global("torch.storage", "UntypedStorage"),
                         b.str("0"), b.str("cpu"), b.integer(int64_t(count))})};
  std::vector<value*> args = {pid, b.integer(0), b.ints(shape), b.ints(contiguous_strides(shape)), b.boolean(false),
                              b.ordered_dict()};
  if (!typed) args.push_back(b.global("torch", di.name));
  b.doc.root = b.call(b.global("torch._utils", typed ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3"), b.tuple(args));
  return pickle::write(b.doc.root, 2, &b.doc);
}

// Where an item landed: its file and byte range.
struct item_place {
  uint32_t rank = 0;
  uint64_t offset = 0, length = 0;
};

// One chunk as FileSystemWriter's _write_item makes it: torch.save(chunk) into the stream
// at its current offset (formats.md §9.3). Returns the archive's length.
uint64_t write_item(const detail::tensor_bytes& source, const convert_tensor& t, const band& b, output_file& out,
                    uint64_t base) {
  const std::vector<uint8_t> pkl = chunk_pickle(t.type, b.sizes, b.nbytes);
  zip::writer w(out.fd(), "archive");
  w.on_bytes_out([&out, base](uint64_t n) { out.start_writeback(base + n); });
  w.add_record("data.pkl", pkl);
  w.add_record(".format_version", "1", 1);
  w.add_record(".storage_alignment", "64", 2);
  w.add_record("byteorder", "little", 6);
  if (auto range = source.straight_rows(t, b.row0, b.rows)) {
    w.add_record_copy("data/0", range->fd, range->offset, range->nbytes, range->crc32);
  } else {
    const detail::tensor_buffer data = source.gather_rows(t, b.row0, b.rows);
    if (data.nbytes != b.nbytes) throw error(errc::io, "a band of '" + t.name + "' came out of the wrong size (internal error)");
    w.add_record("data/0", data.bytes.get(), size_t(data.nbytes));
  }
  w.add_record("version", "3\n", 2);
  w.finish();
  return w.offset();
}

// A BYTE_IO item's bytes, as they are in the input (stream transforms and all).
void copy_item(const checkpoint& c, const convert_byte_item& it, output_file& out) {
  const byte_source& src = *c.files.at(it.file).source;
  constexpr uint64_t kPiece = 16ull << 20;
  std::vector<uint8_t> buf(size_t(std::min(it.length, kPiece)));
  for (uint64_t at = 0; at < it.length; at += kPiece) {
    const uint64_t n = std::min(kPiece, it.length - at);
    try {
      src.read_exact(it.offset + at, buf.data(), size_t(n));
    } catch (error& e) {
      src.locate(e);
      throw;
    }
    out.write(buf.data(), size_t(n));
  }
}

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

std::vector<uint8_t> metadata_pickle(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
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

std::string absolute_id(const std::string& path) {
  std::filesystem::path p = std::filesystem::absolute(path).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

std::vector<std::string> dcp_files(const convert_plan&, uint32_t ranks) {
  std::vector<std::string> files;
  for (uint32_t r = 0; r < ranks; ++r) files.push_back(data_file_name(r));
  files.push_back(kMetadataName);
  return files;
}

convert_result write_converted_dcp(const checkpoint& c, const convert_plan& plan, output_dir& out,
                                   const convert_request& request) {
  if (request.ranks == 0) throw error(errc::usage, "--ranks must be at least 1");
  for (const auto& t : plan.tensors)
    if (t.tie_of) throw error(errc::io, "a DCP plan holds no ties (internal error)");
  const dcp_layout layout = lay_out(plan, request.ranks);
  const detail::tensor_bytes source(c, plan, request);
  std::vector<item_place> places(layout.bands.size()), byte_places(plan.byte_items.size());
  convert_result result;
  uint64_t done = 0;
  for (uint32_t r = 0; r < request.ranks; ++r) {
    const std::string name = data_file_name(r);
    output_set set;
    set.set_staged();
    output_file& o = set.add_output(out.staged(name));
    set.open();
    uint64_t offset = 0;
    for (size_t i = 0; r == 0 && i < plan.byte_items.size(); ++i) {
      copy_item(c, plan.byte_items[i], o);
      byte_places[i] = {0, offset, plan.byte_items[i].length};
      offset += plan.byte_items[i].length;
    }
    for (size_t k : layout.items[r]) {
      const band& bd = layout.bands[k];
      const uint64_t length = write_item(source, plan.tensors[bd.tensor], bd, o, offset);
      places[k] = {r, offset, length};
      offset += length;
      done += bd.nbytes;
      if (request.progress) request.progress(done, plan.data_bytes);
    }
    set.commit();
    result.bytes_written += offset;
    result.files.push_back(name);
  }
  const std::vector<uint8_t> md = metadata_pickle(c, plan, layout, places, byte_places, absolute_id(out.path()));
  check_reads_back(md, plan, layout);
  output_set set;
  set.set_staged();
  output_file& o = set.add_output(out.staged(kMetadataName));
  set.open();
  o.write(md.data(), md.size());
  set.commit();
  result.bytes_written += md.size();
  result.files.push_back(kMetadataName);
  return result;
}

}  // namespace ckpt
