// convert --to dcp (formats.md §9.9): a torch.distributed.checkpoint directory as
// FileSystemWriter writes it for K ranks that held every tensor as a DTensor sharded on
// dimension 0 (Shard(0)): `__{r}_0.distcp` per rank, each a run of torch.save archives
// (one per chunk), and `.metadata` last, the pickle torch 2.11's FileSystemWriter writes.
// Each band is gathered alone (or copied straight from the input when it is one range of
// it), so a tensor of several bands never passes through memory whole.
#include <algorithm>
#include <filesystem>

#include "ckpt/convert.h"
#include "ckpt/error.h"
#include "ckpt/pickle_writer.h"
#include "ckpt/zip_writer.h"
#include "convert/dcp_layout.h"
#include "convert/tensor_bytes.h"
#include "pickle/pickle_builder.h"

namespace ckpt {

namespace detail {

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

}  // namespace detail

namespace {

using detail::band;
using detail::contiguous_strides;
using detail::dcp_layout;
using detail::data_file_name;
using detail::item_place;
using pickle::kind;
using pickle::value;

const char* kMetadataName = ".metadata";

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
  const dcp_layout layout = detail::lay_out(plan, request.ranks);
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
  const std::vector<uint8_t> md =
      detail::dcp_metadata_pickle(c, plan, layout, places, byte_places, absolute_id(out.path()));
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
