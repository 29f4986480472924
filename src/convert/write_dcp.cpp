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

namespace {

// One distinct box of a tensor and the ranks [first, last] whose DTensor holds it.
struct candidate {
  size_t tensor = 0;
  uint32_t first = 0, last = 0;
  std::vector<int64_t> offsets, sizes;
  uint64_t nbytes = 0;
};

placement placement_of(const convert_tensor& t, const slice_selection* placements) {
  std::optional<placement> p = placements ? placements->match(t.name) : std::nullopt;
  if (!p) {
    placement dflt;
    if (!t.shape.empty()) dflt.type = placement::kind::shard;  // Shard(0)
    return dflt;
  }
  if (p->type == placement::kind::range)
    throw error(errc::usage, "key '" + t.name + "': " + placement_text(*p) +
                                 " is not a DTensor placement: --to dcp takes Shard(d) and Replicate() only");
  return *p;
}

}  // namespace

dcp_layout lay_out(const convert_plan& plan, uint32_t ranks, const slice_selection* placements) {
  if (ranks == 0) throw error(errc::usage, "--ranks must be at least 1");
  // Every rank's SavePlan holds one item per tensor, its DTensor's local box; equal
  // boxes (equal offsets) are one MetadataIndex, met on a run of ranks: all of them for a
  // replicated tensor, the trailing ones for the empty boxes at the end of a dimension.
  std::vector<candidate> found;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const convert_tensor& t = plan.tensors[i];
    const placement p = placement_of(t, placements);
    uint64_t numel_all = 1;
    for (int64_t d : t.shape) numel_all *= uint64_t(d);
    const uint64_t es = numel_all ? t.nbytes / numel_all : 0;  // bytes per element, as written
    for (uint32_t r = 0; r < ranks; ++r) {
      const std::vector<dim_range> box = slice_box(p, t.shape, r, ranks, "key '" + t.name + "'");
      candidate c;
      c.tensor = i;
      c.first = c.last = r;
      uint64_t numel = 1;
      for (const dim_range& d : box) {
        c.offsets.push_back(d.start);
        c.sizes.push_back(d.length);
        numel *= uint64_t(d.length);
      }
      // A band of whole rows counts bytes per row, which holds for dtypes packing several
      // elements in a byte too (those cannot be cut otherwise: gather_box refuses them).
      bool rows_only = true;
      for (size_t d = 1; d < box.size(); ++d) rows_only = rows_only && box[d].length == t.shape[d];
      if (t.shape.empty())
        c.nbytes = t.nbytes;
      else if (rows_only)
        c.nbytes = t.shape[0] ? t.nbytes / uint64_t(t.shape[0]) * uint64_t(box[0].length) : 0;
      else
        c.nbytes = numel * es;
      if (r > 0 && found.back().tensor == i && found.back().offsets == c.offsets) {
        found.back().last = r;
        continue;
      }
      found.push_back(std::move(c));
    }
  }
  // dedup_save_plans (formats.md §9.9): items in the order first met, rank 0's plan first,
  // then the items new in rank 1's, and so on; each goes to the rank of those holding it
  // with the fewest bytes assigned so far (the lowest on a tie), an item counting its
  // bytes, or 1 when it has none.
  std::stable_sort(found.begin(), found.end(), [](const candidate& a, const candidate& b) { return a.first < b.first; });
  std::vector<uint64_t> load(ranks, 0);
  load[0] += plan.byte_items.size();  // BYTE_IO items are rank 0's, each counting 1
  dcp_layout out;
  out.chunks.resize(plan.tensors.size());
  out.items.resize(ranks);
  for (candidate& c : found) {
    uint32_t at = c.first;
    for (uint32_t r = c.first + 1; r <= c.last; ++r)
      if (load[r] < load[at]) at = r;
    load[at] += std::max<uint64_t>(c.nbytes, 1);
    band b;
    b.tensor = c.tensor;
    b.rank = at;
    b.nbytes = c.nbytes;
    b.offsets = std::move(c.offsets);
    b.sizes = std::move(c.sizes);
    out.bands.push_back(std::move(b));
  }
  // A rank's file holds its items in state-dict order; a tensor's chunks are in rank order
  // (create_default_global_save_plan walks the plans rank by rank).
  std::vector<size_t> order(out.bands.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const band &x = out.bands[a], &y = out.bands[b];
    return x.rank != y.rank ? x.rank < y.rank : x.tensor < y.tensor;
  });
  for (size_t k : order) {
    out.items[out.bands[k].rank].push_back(k);
    out.chunks[out.bands[k].tensor].push_back(k);
  }
  return out;
}

dcp_layout lay_out(const convert_plan& plan, const convert_request& request) {
  return lay_out(plan, request.ranks, request.placements ? &*request.placements : nullptr);
}

std::vector<uint64_t> dcp_file_bytes(const dcp_layout& layout, uint32_t ranks) {
  std::vector<uint64_t> bytes(size_t(ranks) + 1, 0);
  for (const band& b : layout.bands) bytes[b.rank] += b.nbytes;
  return bytes;
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
  // A band of whole rows (Shard(0), a whole tensor) is one range of a row-major source;
  // any other box is read as the strided runs it is (formats.md §16.3).
  bool rows_only = true;
  for (size_t d = 1; d < t.shape.size(); ++d) rows_only = rows_only && b.offsets[d] == 0 && b.sizes[d] == t.shape[d];
  const int64_t row0 = t.shape.empty() ? 0 : b.offsets[0], rows = t.shape.empty() ? 1 : b.sizes[0];
  std::optional<detail::file_range> range;
  if (rows_only) range = source.straight_rows(t, row0, rows);
  if (range) {
    w.add_record_copy("data/0", range->fd, range->offset, range->nbytes, range->crc32);
  } else {
    const detail::tensor_buffer data = rows_only ? source.gather_rows(t, row0, rows) : source.gather_box(t, b.offsets, b.sizes);
    if (data.nbytes != b.nbytes) throw error(errc::io, "a chunk of '" + t.name + "' came out of the wrong size (internal error)");
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

namespace detail {

dcp_written write_dcp_files(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                            const std::string& directory, const std::vector<bool>& mine,
                            const convert_request& request) {
  for (const auto& t : plan.tensors)
    if (t.tie_of) throw error(errc::io, "a DCP plan holds no ties (internal error)");
  const auto is_mine = [&](uint32_t r) { return mine.empty() || (r < mine.size() && mine[r]); };
  const detail::tensor_bytes source(c, plan, request);
  dcp_written w;
  w.places.resize(layout.bands.size());
  w.byte_places.resize(plan.byte_items.size());
  uint64_t total = 0, done = 0;  // progress counts the files written here
  for (const band& b : layout.bands)
    if (is_mine(b.rank)) total += b.nbytes;
  const uint32_t ranks = uint32_t(layout.items.size());
  for (uint32_t r = 0; r < ranks; ++r) {
    if (!is_mine(r)) continue;
    const std::string name = data_file_name(r);
    output_set set;
    set.set_staged();
    output_file& o = set.add_output(directory + "/" + name);
    set.open();
    uint64_t offset = 0;
    for (size_t i = 0; r == 0 && i < plan.byte_items.size(); ++i) {
      copy_item(c, plan.byte_items[i], o);
      w.byte_places[i] = {0, offset, plan.byte_items[i].length};
      offset += plan.byte_items[i].length;
    }
    for (size_t k : layout.items[r]) {
      const band& bd = layout.bands[k];
      const uint64_t length = write_item(source, plan.tensors[bd.tensor], bd, o, offset);
      w.places[k] = {r, offset, length};
      offset += length;
      done += bd.nbytes;
      if (request.progress) request.progress(done, total);
    }
    set.commit();
    w.result.bytes_written += offset;
    w.result.files.push_back(name);
  }
  return w;
}

uint64_t write_dcp_metadata(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                            const dcp_written& written, const std::string& directory, const std::string& checkpoint_id) {
  const std::vector<uint8_t> md =
      dcp_metadata_pickle(c, plan, layout, written.places, written.byte_places, absolute_id(checkpoint_id));
  output_set set;
  set.set_staged();
  output_file& o = set.add_output(directory + "/" + kMetadataName);
  set.open();
  o.write(md.data(), md.size());
  set.commit();
  return md.size();
}

}  // namespace detail

convert_result write_converted_dcp(const checkpoint& c, const convert_plan& plan, output_dir& out,
                                   const convert_request& request) {
  const dcp_layout layout = detail::lay_out(plan, request);
  detail::dcp_written w = detail::write_dcp_files(c, plan, layout, out.staging_directory(), {}, request);
  w.result.bytes_written += detail::write_dcp_metadata(c, plan, layout, w, out.staging_directory(), out.path());
  w.result.files.push_back(kMetadataName);
  return w.result;
}

}  // namespace ckpt
