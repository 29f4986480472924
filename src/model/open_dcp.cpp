// What the reader relies on (docs/formats.md §9): `.metadata` says which chunks make each
// tensor and where each chunk's bytes are; those bytes are a whole torch.save archive of
// the chunk (filesystem.py _write_item calls torch.save on the item's stream), which
// FileSystemReader.read_data loads with torch.load(weights_only=True). We open that
// archive with the torch-zip reader over a slice of the `.distcp` file, check it is the
// chunk the metadata describes, and point the chunk's storage at its data record in the
// `.distcp` itself (records are stored, never deflated, so the bytes are the data).
#include "model/open_dcp.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "base/text.h"
#include "formats/dcp_transforms.h"
#include "io/slice_source.h"

namespace ckpt::detail {
namespace {

int64_t volume(const dim_list& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;  // bounded: check_coverage refused shapes past INT64_MAX
  return n;
}

dim_list contiguous_stride(const dim_list& shape) {
  dim_list stride;
  stride.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) stride[i - 1] = stride[i] * std::max<int64_t>(shape[i], 1);
  return stride;
}

// "fqn@(0, 64)": a chunk's storage key, built in one string (once per chunk).
std::string storage_key(const std::string& fqn, const dim_list& offsets) {
  std::string key;
  key.reserve(fqn.size() + 4 + 8 * offsets.size());
  key.append(fqn).append(1, '@').append(1, '(');
  char digits[24];
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (i) key.append(", ", 2);
    key.append(digits, std::to_chars(digits, digits + sizeof digits, offsets[i]).ptr);
  }
  key.append(offsets.size() == 1 ? ",)" : ")");
  return key;
}

// planner_data's path for a key when the writer flattened a nested state dict; the key
// itself otherwise.
value_path item_path(const std::unordered_map<std::string_view, const dcp::planner_path*>& planned,
                     const std::string& fqn) {
  auto it = planned.find(fqn);
  if (it == planned.end()) return {fqn};
  value_path p;
  for (const auto& e : it->second->path) {
    if (e.is_index)
      p.emplace_back(e.index);
    else
      p.emplace_back(e.key);
  }
  return p.empty() ? value_path{fqn} : p;
}

struct data_file {
  uint32_t index;                              // in checkpoint::files
  std::shared_ptr<const byte_source> source;   // shared by the slices of its items
};

class dcp_reader {
 public:
  dcp_reader(const file_opener& fs, const layout& l, const open_options& o) : fs_(fs), dir_(l.file), layout_(l), o_(o) {}

  checkpoint read() {
    c_.path = fs_.display(dir_);
    c_.layout = checkpoint_layout::dcp;
    c_.format = file_format::torch_zip;
    c_.index_path = fs_.display(text::file_in(dir_, layout_.metadata.at(0)));
    if (layout_.metadata.front() == ".metadata") {
      md_ = read_metadata_file(".metadata");
      // Checked once md_ holds it: the index check_metadata returns points into md_.
      try {
        where_ = dcp::check_metadata(md_);
      } catch (error& e) {
        e.with_file(c_.index_path);
        throw;
      }
    } else {
      read_rank_local();
      where_ = dcp::storage_index(md_.storage_data, md_.sources);  // merge_rank_local checked it
    }
    c_.writer = md_.version ? *md_.version : std::string();
    c_.globals = md_.globals;
    if (md_.planner_data_opaque)
      c_.warnings.push_back("planner_data is of a form this reader does not decode (a custom planner's): keys are "
                            "listed as .metadata names them");
    for (const auto& f : md_.unknown_fields)
      c_.warnings.push_back(".metadata has a field this reader does not know: " + f + " (kept unread)");
    planned_.reserve(md_.planner_data.size());
    for (const auto& p : md_.planner_data) planned_[p.fqn] = &p;
    open_data_files();

    size_t chunks = 0;
    for (const auto& it : md_.items)
      if (it.is_tensor) chunks += it.tensor.chunks.size();
    if (chunks > o_.max_tensors)
      throw error(errc::limit, std::to_string(chunks) + " chunks, over the tensor limit (raise with --max-tensors)")
          .with_file(c_.index_path);
    c_.tensors.reserve(chunks);
    c_.storages.reserve(chunks);
    for (const auto& it : md_.items) {
      if (it.is_tensor)
        read_tensor(it);
      else
        read_bytes_item(it);
    }
    if (o_.read_chunk_archives) compare_replicas();
    read_lightning_meta();
    std::sort(c_.globals.begin(), c_.globals.end());
    c_.globals.erase(std::unique(c_.globals.begin(), c_.globals.end()), c_.globals.end());
    c_.unsafe_globals.assign(unsafe_.begin(), unsafe_.end());
    c_.state_dict = value_path{};
    c_.keys.shrink_to_fit();
    return std::move(c_);
  }

 private:
  // One metadata file, decoded; the caller checks it (alone, or merged with its ranks').
  dcp::metadata read_metadata_file(const std::string& name) {
    std::unique_ptr<byte_source> src = fs_.open(text::file_in(dir_, name));
    dcp::metadata md;
    try {
      dcp::decode_options d;
      d.lim = o_.pickle_limits;
      md = dcp::decode_metadata(*src, d);
    } catch (error& e) {
      src->locate(e);
      c_.index_bytes_read += src->bytes_read();
      throw;
    }
    c_.index_bytes_read += src->bytes_read();
    return md;
  }

  // use_collectives=False (§9.8): one metadata file per rank, each of its own items. Every
  // rank from 0 up must be there: a rank whose file is missing lost its items, which a
  // replicated tensor's coverage would not show.
  void read_rank_local() {
    std::vector<dcp::metadata> ranks;
    std::vector<std::string> names;
    for (const std::string& name : layout_.metadata) {
      const uint32_t r = *dcp::rank_local_metadata_rank(name);
      if (r != ranks.size())
        throw error(errc::corrupt, "rank-local metadata files (dcp.save with use_collectives=False) of ranks up to " +
                                       std::to_string(r) + " without __" + std::to_string(ranks.size()) +
                                       ".metadata: the save did not complete, or a file was lost")
            .with_file(c_.path);
      ranks.push_back(read_metadata_file(name));
      names.push_back(fs_.display(text::file_in(dir_, name)));
    }
    for (const std::string& part : layout_.parts) {
      // `__{rank}_{n}.distcp`: a data file of a rank with no metadata file.
      const size_t under = part.find('_', 2);
      if (part.compare(0, 2, "__") != 0 || under == std::string::npos) continue;
      const std::optional<uint32_t> r = dcp::rank_local_metadata_rank(part.substr(0, under) + ".metadata");
      if (r && *r >= ranks.size())
        throw error(errc::corrupt, "a data file of rank " + std::to_string(*r) + ", but no __" + std::to_string(*r) +
                                       ".metadata: the save did not complete, or a file was lost")
            .with_file(fs_.display(text::file_in(dir_, part)));
    }
    md_ = dcp::merge_rank_local(std::move(ranks), names);
    c_.warnings.push_back("rank-local metadata (dcp.save with use_collectives=False): " + std::to_string(names.size()) +
                          " files merged; dcp.load reads only the loading rank's own file, so it loads this "
                          "checkpoint only into the same ranks with the same layout");
  }

  // Every file storage_data names, opened once, in name order.
  void open_data_files() {
    std::set<std::string> names;
    for (const auto& s : md_.storage_data) names.insert(s.relative_path);
    for (const auto& s : md_.replicas) names.insert(s.relative_path);
    for (const auto& name : names) {
      const std::string rel = text::file_in(dir_, checked_relative_path(name));
      std::shared_ptr<const byte_source> whole = fs_.open(rel);
      source_file f;
      f.path = fs_.display(rel);
      f.format = file_format::torch_zip;
      f.size = whole->size();
      // The set's own view of the file; slices for its items share the open file.
      f.source = std::make_unique<slice_source>(whole, 0, whole->size());
      files_[name] = {uint32_t(c_.files.size()), whole};
      c_.files.push_back(std::move(f));
    }
  }

  // The item's bytes as a source: a slice of its file, or those bytes with the stream
  // transforms undone, in memory.
  std::unique_ptr<byte_source> item_source(const dcp::storage_item& s) {
    const data_file& f = files_.at(s.relative_path);
    auto slice = std::make_unique<slice_source>(f.source, s.offset, s.length);
    // A chunk's archive is read at both ends while it is opened (its records' headers
    // first, its directory last): 1 KiB at each end holds them for a torch.save of a tensor.
    if (s.transform_descriptors.empty()) {
      slice->keep_ends(1024);
      return slice;
    }
    const uint64_t budget = o_.zip_limits.max_inflated_total > inflated_ ? o_.zip_limits.max_inflated_total - inflated_ : 0;
    std::vector<uint8_t> bytes =
        undo_dcp_transforms(*slice, s.transform_descriptors, std::min(o_.zip_limits.max_record_bytes, budget));
    inflated_ += bytes.size();
    return std::make_unique<memory_source>(std::move(bytes), c_.files[f.index].path + " (item at byte " +
                                                                 std::to_string(s.offset) + ", after " +
                                                                 s.transform_descriptors.front() + ")");
  }

  const dcp::storage_item& storage_of(const std::string& fqn, const dim_list* offsets) {
    return *where_.find(fqn, offsets);  // check_metadata found every chunk's and item's entry
  }

  [[noreturn]] void mismatch(const dcp::storage_item& s, const std::string& what) {
    const data_file& f = files_.at(s.relative_path);
    throw error(errc::corrupt, what, s.offset).with_file(c_.files[f.index].path);
  }

  // Opens the item's embedded archive with the single-file reader; the caller checks what
  // it holds. The source file joins the set (verify checks its CRCs).
  checkpoint open_item(const dcp::storage_item& s) {
    if (!known_dcp_transforms(s.transform_descriptors)) {
      std::string all;
      for (const auto& d : s.transform_descriptors) all += (all.empty() ? "" : ", ") + d;
      error e(errc::unsupported, "item '" + s.fqn + "' was written through stream transforms this build cannot undo (" +
                                     all + "; it undoes only stream.zstd/1)", s.offset);
      throw e.with_file(c_.files[files_.at(s.relative_path).index].path);
    }
    checkpoint a = open_checkpoint(item_source(s), o_);
    for (const auto& g : a.globals) c_.globals.push_back(g);
    for (const auto& g : a.unsafe_globals) unsafe_.insert(g);
    return a;
  }

  uint32_t adopt(checkpoint& a, const dcp::storage_item& s) {
    source_file f = std::move(a.files.at(0));
    if (auto* ends = dynamic_cast<slice_source*>(f.source.get())) ends->drop_ends();  // item_source's, read
    // What the archive's pickle said is in its records now; its tree is a few KB per chunk,
    // which for a hundred thousand chunks is memory no verb needs. The zip stays: verify
    // checks its records' CRCs.
    f.pickle.reset();
    f.extra_pickles.clear();
    const data_file& d = files_.at(s.relative_path);
    f.path = c_.files[d.index].path;
    f.within = d.index;
    f.offset_within = s.offset;
    f.size = s.length;
    c_.files.push_back(std::move(f));
    return uint32_t(c_.files.size() - 1);
  }

  // The tensors inside a value decoded from a pickle of its own (`a`: a BYTE_IO item's
  // archive, meta.pt), as entry_value_seen shows them. With keep_entry_tensors (diff, which
  // compares their values) their records and storages join the checkpoint's, below path
  // `under`, the storages read from file `file`: the index `a`'s file gets when adopted.
  std::vector<entry_tensor> entry_tensors(const checkpoint& a, const value_path& under, uint32_t file) {
    std::vector<entry_tensor> out;
    std::map<size_t, size_t> ours;  // a's storage -> c_'s
    for (const tensor_record& r : a.tensors) {
      entry_tensor e;
      e.node = r.node;
      e.type = r.type;
      e.shape.assign(r.shape.begin(), r.shape.end());
      if (o_.keep_entry_tensors) {
        tensor_record t = r;
        t.node = nullptr;  // a's pickle is released once read
        t.path = under;
        t.path.insert(t.path.end(), r.path.begin(), r.path.end());
        if (r.storage) {
          auto [it, fresh] = ours.emplace(*r.storage, c_.storages.size());
          if (fresh) {
            storage_record s = a.storages.at(*r.storage);
            s.file = file;
            c_.storages.push_back(std::move(s));
          }
          t.storage = it->second;
        }
        e.record = c_.tensors.size();
        c_.tensors.push_back(std::move(t));
      }
      out.push_back(std::move(e));
    }
    return out;
  }

  // One chunk: its tensor record and storage, checked against the metadata.
  size_t read_chunk(const dcp::item& it, const dcp::chunk& ch, const value_path& path) {
    return read_chunk(it, ch, path, storage_of(it.fqn, &ch.offsets));
  }

  size_t read_chunk(const dcp::item& it, const dcp::chunk& ch, const value_path& path, const dcp::storage_item& s) {
    const data_file& d = files_.at(s.relative_path);
    tensor_record t;
    storage_record st;
    st.key = storage_key(it.fqn, ch.offsets);
    st.type = it.tensor.type;
    st.location = "cpu";
    st.tensor_count = 1;
    const bool open = opened(it, ch);
    if (!open) {
      // The range must lie in the file even when it is not opened: a slice checks it.
      slice_source check(d.source, s.offset, s.length);
      (void)check;
      st.file = d.index;
      st.file_offset = s.offset;
      st.nbytes = s.length;
      st.archive_range = true;
      t.shape = ch.sizes;
      t.stride = contiguous_stride(ch.sizes);
    } else {
      checkpoint a = open_item(s);
      const std::string in = "tensor '" + it.fqn + "', chunk at offsets " + dcp::format_shape(ch.offsets) +
                             ", sizes " + dcp::format_shape(ch.sizes) + ": its archive ";
      if (a.format != file_format::torch_zip) mismatch(s, in + "is a " + std::string(format_name(a.format)) + " file, not a torch.save archive");
      if (a.tensors.size() != 1 || !a.tensors[0].path.empty())
        mismatch(s, in + "holds " + std::to_string(a.tensors.size()) + " tensors" +
                        (a.tensors.size() == 1 ? " below its root" : "") + ", not one tensor at its root");
      const tensor_record& r = a.tensors[0];
      if (r.kind || r.quant || !r.storage)
        mismatch(s, in + "holds a " + std::string(r.kind ? r.kind->layout : r.quant ? "quantized" : "meta") +
                        " tensor, not a plain one");
      if (r.type != it.tensor.type || r.shape != ch.sizes)
        mismatch(s, in + "holds " + std::string(name(r.type)) + " " + text::shape(r.shape) + ", the metadata says " +
                        name(it.tensor.type) + " " + dcp::format_shape(ch.sizes));
      if (a.storages.size() != 1 || a.storages[0].nbytes < r.nbytes())
        mismatch(s, in + "holds " + std::to_string(a.storages.size()) + " storages, not the one the tensor needs");
      storage_record as = a.storages[0];
      t = r;
      t.node = nullptr;  // the archive's pickle is released below (adopt)
      st.nbytes = as.nbytes;
      st.crc32 = as.crc32;
      st.record = as.record;
      st.location = as.location;
      const uint32_t fi = adopt(a, s);
      if (s.transform_descriptors.empty()) {
        // Stored records: the data is these bytes of the .distcp file itself.
        st.file = d.index;
        st.file_offset = s.offset + *as.file_offset;
      } else {
        st.file = fi;
        st.file_offset = as.file_offset;
      }
    }
    t.path = path;
    t.type = it.tensor.type;
    t.requires_grad = it.tensor.requires_grad;
    t.location = st.location;
    if (open && !md_.replicas.empty())
      prints_.emplace(std::make_pair(it.fqn, ch.offsets),
                      chunk_print{std::vector<int64_t>(t.shape.begin(), t.shape.end()),
                                  std::vector<int64_t>(t.stride.begin(), t.stride.end()), t.storage_offset, st.nbytes,
                                  st.crc32, &s});
    t.storage = c_.storages.size();
    c_.storages.push_back(std::move(st));
    c_.tensors.push_back(std::move(t));
    return c_.tensors.size() - 1;
  }

  // Whether the chunk's archive is opened (open_options::open_chunk).
  bool opened(const dcp::item& it, const dcp::chunk& ch) const {
    return o_.read_chunk_archives && (!o_.open_chunk || o_.open_chunk(it.fqn, it.tensor.size, ch.offsets, ch.sizes));
  }

  void read_tensor(const dcp::item& it) {
    const dcp::tensor_meta& tm = it.tensor;
    const value_path path = item_path(planned_, it.fqn);
    // Distinct boxes (a replicated box is listed once per replica at most), non-empty ones
    // as pieces; an empty box holds no element, but its archive is still read and checked.
    std::vector<const dcp::chunk*> boxes;
    for (const auto& ch : tm.chunks) {
      const bool seen = std::any_of(boxes.begin(), boxes.end(), [&](const dcp::chunk* b) {
        return b->offsets == ch.offsets && b->sizes == ch.sizes;
      });
      if (!seen) boxes.push_back(&ch);
    }
    const int64_t whole = volume(tm.size);
    const dcp::chunk* entire = nullptr;
    for (const dcp::chunk* b : boxes)
      if (b->sizes == tm.size) entire = b;
    if (entire) {
      // One chunk holds the whole tensor (a plain tensor, a replicated DTensor): a plain key.
      size_t tensor = 0;
      for (const dcp::chunk* b : boxes) {
        if (b != entire && volume(b->sizes) != 0) continue;  // coverage: only empty ones remain
        if (b == entire)
          tensor = read_chunk(it, *b, path);
        else if (o_.read_chunk_archives)
          check_only(it, *b);
      }
      c_.keys.add(it.fqn, tensor);
      return;
    }
    std::vector<tensor_piece> pieces;
    for (const dcp::chunk* b : boxes) {
      if (volume(b->sizes) == 0 && whole != 0) {
        if (o_.read_chunk_archives) check_only(it, *b);
        continue;
      }
      pieces.push_back({read_chunk(it, *b, path), b->offsets});
    }
    c_.keys.add(it.fqn, tm.type, tm.size, std::move(pieces));
  }

  // An empty chunk: nothing of it is loaded, but a broken archive is still a broken file.
  void check_only(const dcp::item& it, const dcp::chunk& ch) {
    const size_t tensors = c_.tensors.size(), storages = c_.storages.size();
    read_chunk(it, ch, {it.fqn});
    c_.tensors.resize(tensors);
    c_.storages.resize(storages);
  }

  // A box or value several ranks of a rank-local save wrote (§9.8), each its own copy: the
  // lowest rank's is read; every other copy is opened too (verify checks its records) and
  // must be the same tensor: same layout, same data record (its CRC-32 and size; verify
  // checks each record's bytes against its CRC). Copies that differ have no one value:
  // each rank's dcp.load reads its own.
  void compare_replicas() {
    std::map<std::string, const dcp::item*> items;
    for (const auto& it : md_.items) items.emplace(it.fqn, &it);
    for (const dcp::storage_item& r : md_.replicas) {
      const dcp::item& it = *items.at(r.fqn);
      if (!r.offsets) {
        const entry_summary copy = bytes_entry(it, r, false);
        const std::string& kept = byte_values_.at(it.fqn);
        if (copy.type + " " + copy.value != kept)
          c_.warnings.push_back("BYTE_IO item '" + it.fqn + "' differs between ranks: " + md_.sources[0] +
                                "'s value is shown, " + md_.sources[r.source] + " holds " + copy.type + " " + copy.value);
        continue;
      }
      const auto ch = std::find_if(it.tensor.chunks.begin(), it.tensor.chunks.end(), [&](const dcp::chunk& c) {
        return c.source == r.source && c.offsets == *r.offsets;
      });
      // check_storage_index matched every entry of a file with a box of that file.
      if (ch == it.tensor.chunks.end()) mismatch(r, "tensor '" + it.fqn + "': a storage entry with no box of its file");
      if (!opened(it, *ch)) continue;  // the kept copy was not opened either: same box
      const chunk_print& kept = prints_.at({it.fqn, *r.offsets});
      const size_t tensors = c_.tensors.size(), storages = c_.storages.size();
      const tensor_record& t = c_.tensors[read_chunk(it, *ch, {it.fqn}, r)];
      const storage_record& st = c_.storages[*t.storage];
      const bool same = kept.shape == std::vector<int64_t>(t.shape.begin(), t.shape.end()) &&
                        kept.stride == std::vector<int64_t>(t.stride.begin(), t.stride.end()) &&
                        kept.storage_offset == t.storage_offset && kept.nbytes == st.nbytes && kept.crc32 == st.crc32;
      if (!same)
        mismatch(r, "tensor '" + it.fqn + "', chunk at offsets " + dcp::format_shape(*r.offsets) + ": this rank's copy (" +
                        md_.sources[r.source] + ") differs from the one in " + kept.storage->relative_path + " (" +
                        md_.sources[kept.storage->source] +
                        "); a rank-local save of different values has no single one to read (each rank's dcp.load "
                        "reads its own)");
      c_.tensors.resize(tensors);
      c_.storages.resize(storages);
    }
  }

  // A BYTE_IO item: a torch.save of any Python value, which PyTorch loads with
  // weights_only=False. Decoded by our pickle machine (nothing runs) to show it, and to
  // name the globals that load would import.
  void read_bytes_item(const dcp::item& it) {
    entry_summary e = bytes_entry(it, storage_of(it.fqn, nullptr));
    if (!md_.replicas.empty()) byte_values_[it.fqn] = e.type + " " + e.value;
    c_.entries.push_back(std::move(e));
  }

  // `shown`: the copy whose value the checkpoint shows (not another rank's replica).
  entry_summary bytes_entry(const dcp::item& it, const dcp::storage_item& s, bool shown = true) {
    entry_summary e;
    e.path = item_path(planned_, it.fqn);
    checkpoint a = open_item(s);
    const pickle::value* root = a.files[0].pickle ? a.files[0].pickle->root : nullptr;
    if (!root) {
      e.type = "bytes";
      e.value = "a " + std::string(format_name(a.format)) + " file of " + std::to_string(s.length) + " bytes";
    } else {
      e.type = root->type == pickle::kind::object && root->callable_global() ? root->callable_global()->global_name()
                                                                               : text::python_type_name(root->type);
      e.tensors_inside = a.tensors.size();
      e.value = a.tensors.empty() ? pickle::repr(root, 120)
                                  : std::to_string(a.tensors.size()) + (a.tensors.size() == 1 ? " tensor" : " tensors") +
                                        " inside (not loaded: a BYTE_IO item)";
    }
    // adopt, below, gives the archive the next file index: what its kept storages read.
    if (root && o_.entry_value_seen && shown)
      o_.entry_value_seen(e.path, *root, entry_tensors(a, e.path, uint32_t(c_.files.size())));
    if (!a.unsafe_globals.empty()) {
      std::string names;
      for (const auto& g : a.unsafe_globals) names += (names.empty() ? "" : ", ") + g;
      e.value += "  [unsafe: " + names + "]";
    }
    adopt(a, s);
    return e;
  }

  // Lightning's FSDP strategy saves the model and optimizer with DCP and everything else
  // (epoch, loops, hyper-parameters) with torch.save into meta.pt beside them
  // (lightning/fabric/strategies/fsdp.py save_checkpoint, _METADATA_FILENAME). Its
  // entries are shown under "meta.pt"; it is read by the single-file reader, nothing run.
  void read_lightning_meta() {
    const std::string rel = text::file_in(dir_, "meta.pt");
    if (fs_.stat(rel).kind != file_kind::regular) return;
    checkpoint m = open_checkpoint(fs_.open(rel), o_);
    std::vector<entry_tensor> tensors;  // meta.pt's file joins the set as the next index
    if (o_.entry_value_seen) tensors = entry_tensors(m, {std::string("meta.pt")}, uint32_t(c_.files.size()));
    for (auto& e : m.entries) {
      e.path.insert(e.path.begin(), std::string("meta.pt"));
      // Its node lives in meta.pt's pickle, which is dropped below.
      if (e.node && o_.entry_value_seen) o_.entry_value_seen(e.path, *e.node, tensors);
      e.node = nullptr;
      c_.entries.push_back(std::move(e));
    }
    // Tensors that meta.pt's reader took for a state dict ({"epoch": 1, "ema": t}) are not
    // the directory's keys: for diff, which must not leave them uncompared, they are
    // entries too, each a tensor.
    if (o_.keep_entry_tensors && o_.entry_value_seen && m.state_dict)
      for (size_t k = 0; k < m.keys.size(); ++k) {
        const tensor_record& t = m.tensors[m.keys.tensor(k)];
        if (!t.node) continue;
        entry_summary e;
        e.path = {std::string("meta.pt")};
        e.path.insert(e.path.end(), m.state_dict->begin(), m.state_dict->end());
        e.path.emplace_back(std::string(m.keys.key(k)));
        e.type = "tensor";
        e.value = std::string(name(t.type)) + " " + text::shape(t.shape);
        o_.entry_value_seen(e.path, *t.node, tensors);
        c_.entries.push_back(std::move(e));
      }
    for (const auto& g : m.globals) c_.globals.push_back(g);
    for (const auto& g : m.unsafe_globals) unsafe_.insert(g);
    c_.lightning = true;
    source_file f = std::move(m.files.at(0));
    f.path = fs_.display(rel);
    f.pickle.reset();
    f.extra_pickles.clear();
    c_.files.push_back(std::move(f));
  }

  const file_opener& fs_;
  std::string dir_;
  const layout& layout_;
  const open_options& o_;
  checkpoint c_;
  dcp::metadata md_;
  std::unordered_map<std::string_view, const dcp::planner_path*> planned_;  // keys: md_'s strings
  dcp::storage_index where_;  // over md_.storage_data
  std::map<std::string, data_file> files_;
  std::set<std::string> unsafe_;
  uint64_t inflated_ = 0;
  // Rank-local saves only: what each kept chunk and BYTE_IO value is, for its replicas.
  struct chunk_print {
    std::vector<int64_t> shape, stride;
    int64_t storage_offset;
    uint64_t nbytes;
    uint32_t crc32;
    const dcp::storage_item* storage;
  };
  std::map<std::pair<std::string, std::vector<int64_t>>, chunk_print> prints_;
  std::map<std::string, std::string> byte_values_;
};

}  // namespace

checkpoint open_dcp(const file_opener& fs, const layout& l, const open_options& options) {
  // The chunks' archives are read as models whatever the caller's purpose: their storages
  // and paths are what the set's records are made of.
  open_options o = options;
  o.intent = open_options::purpose::read;
  return dcp_reader(fs, l, o).read();
}

}  // namespace ckpt::detail
