// load_tensors with a selection (ckpt/load.h, docs/formats.md §16): each matched tensor's
// slice is allocated empty on the CPU and filled from the spans where its pieces meet the
// slice (model/slice_plan.h), read by a few threads; nothing outside the slice is read
// but the few bytes between close rows. Tensors that are not plain row-major bytes load
// whole through the ordinary loader when replicated, and are refused when sliced.
//
// The slice's memory is got as the whole loader gets it (cpu_loader.cpp), for the reasons
// measured there: a slice of a megabyte and more gets an anonymous mapping whose first byte
// is congruent with its first file byte modulo a page where LibTorch's 64-byte alignment
// allows; a slice that is one run of the file (a Shard(0) slice, a replicated tensor, a
// DCP chunk) is then filled page by page from a mapping of the file (page_filler: no
// zeroing, no fault), congruent or not (docs/formats.md §9.3), and any other slice of a mapping is
// faulted in by one call per read before its rows are read (a Shard(1) slice: a pread per
// row, which the slice's bytes alone, 1/W of the rows, would otherwise fault page by page).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "base/text.h"
#include "ckpt/error.h"
#include "ckpt/load_slices.h"
#include "model/assembly.h"
#include "model/read_plan.h"
#include "model/row_major.h"
#include "model/slice_match.h"
#include "model/slice_plan.h"
#include "torch/aten_types.h"
#include "torch/loader/host_buffer.h"
#include "torch/loader/page_filler.h"
#include "torch/loader/storage_loader.h"
#include "torch/named_tensors.h"

namespace ckpt {
namespace {

using detail::slice_read;
using detail::slice_span;

struct stored_piece {
  std::vector<dim_range> box;
  uint32_t file = 0;
  uint64_t offset = 0;  // its first byte, in files[file]
  // A DCP chunk whose archive was not opened (open_options::open_chunk declined it, or a
  // metadata-only open): it has no data range, and a slice that meets it is refused.
  bool unopened = false;
};

struct tensor_source {
  dtype type = dtype::float32;
  std::vector<int64_t> shape;
  std::vector<stored_piece> pieces;
  std::string unsliceable;  // why its bytes cannot be read by box; empty: they can
};

std::vector<dim_range> whole_box(const std::vector<int64_t>& shape) {
  std::vector<dim_range> b;
  for (int64_t n : shape) b.push_back({0, n});
  return b;
}

uint64_t box_numel(const std::vector<dim_range>& b) {
  uint64_t n = 1;
  for (const dim_range& r : b) n *= uint64_t(r.length);
  return n;
}

// Where the bytes of tensor `n` are, as row-major boxes.
tensor_source source_of(const checkpoint& c, const detail::named_tensor& n) {
  tensor_source t;
  if (n.assembled) {
    // plan_assembly refuses (corrupt, unsupported) pieces that overlap, leave elements
    // unwritten, or are not exactly their box's bytes: what is met below is sound.
    (void)detail::plan_assembly(c, {n.key}, /*allow_unopened=*/true);
    t.type = c.keys.type(n.key, c.tensors);
    const dim_list& dims = c.keys.shape(n.key, c.tensors);
    t.shape.assign(dims.begin(), dims.end());
    for (size_t p = 0; p < c.keys.piece_count(n.key); ++p) {
      const tensor_piece piece = c.keys.piece(n.key, p);
      const tensor_record& r = c.tensors[piece.tensor];
      stored_piece s;
      for (size_t d = 0; d < t.shape.size(); ++d)
        s.box.push_back({piece.offsets.empty() ? 0 : piece.offsets[d], r.shape[d]});
      if (box_numel(s.box) == 0) continue;
      const storage_record& st = c.storages[*r.storage];
      s.file = st.file;
      s.offset = *st.file_offset;
      s.unopened = st.archive_range;
      t.pieces.push_back(std::move(s));
    }
    return t;
  }
  const tensor_record& r = c.tensors[n.tensor];
  t.type = r.type;
  t.shape.assign(r.shape.begin(), r.shape.end());
  const uint64_t e = element_size(r.type);
  if (r.quant || r.kind || r.composite()) {
    t.unsliceable = "it is a " + (r.kind ? r.kind->description() : std::string("quantized")) + " tensor";
  } else if (elements_per_byte(r.type) != 1 || e == 0) {
    t.unsliceable = "its dtype " + std::string(name(r.type)) + " packs several elements in a byte";
  } else if (!r.storage || !c.storages[*r.storage].file_offset) {
    t.unsliceable = "it has no data in the file";
  } else if (!detail::is_row_major(r) || r.storage_offset < 0) {
    t.unsliceable = "its view is not row-major (its strides step out of order)";
  } else {
    const storage_record& s = c.storages[*r.storage];
    const uint64_t numel = r.numel();
    if (numel && (uint64_t(r.storage_offset) + numel) * e > s.nbytes)
      t.unsliceable = "its view reaches past its storage";
    else if (numel)
      t.pieces.push_back({whole_box(t.shape), s.file, *s.file_offset + uint64_t(r.storage_offset) * e, s.archive_range});
  }
  return t;
}

// Each thread's bounce buffer for reads of close rows, kept for the next read.
class bounce_pool {
 public:
  std::unique_ptr<uint8_t[]> take(uint64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) return std::unique_ptr<uint8_t[]>(new uint8_t[size_]);
    auto b = std::move(free_.back());
    free_.pop_back();
    (void)n;
    return b;
  }
  void give(std::unique_ptr<uint8_t[]> b) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(b));
  }
  explicit bounce_pool(uint64_t size) : size_(size) {}

 private:
  uint64_t size_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<uint8_t[]>> free_;
};

struct slice_job {
  uint8_t* base = nullptr;  // the slice tensor's first byte
  uint32_t file = 0;
  std::vector<slice_span> spans;
  bool mapped = false;  // base lies in a mapping of its own (allocate_host_tensor)
  bool whole = false;   // the slice's only job: no other writes into its pages
};

struct read_item {
  size_t job = 0;
  slice_read read;
  bool fill = false;  // read.offset .. + nbytes by whole pages from the file's mapping
};

using detail::kPageBytes;
using detail::page_ceil;
using detail::page_floor;
constexpr uint64_t kFillBytes = 16ull << 20;  // a fill item: large enough to amortize, small enough to share out

// What makes two records one tensor to slice: the same bytes seen the same way (storage,
// offset, shape, strides, dtype, bits). A record of another kind is only itself.
std::string same_view_key(const tensor_record& r, size_t index) {
  if (!r.storage || r.composite() || r.quant) return "record " + std::to_string(index);
  std::string key = "storage " + std::to_string(*r.storage) + " at " + std::to_string(r.storage_offset) + " " +
                    std::string(name(r.type)) + (r.conj ? " conj" : "") + (r.neg ? " neg" : "");
  for (int64_t d : r.shape) key += " " + std::to_string(d);
  key += " /";
  for (int64_t d : r.stride) key += " " + std::to_string(d);
  return key;
}

// The slice of `t` (shape, dtype): a mapping of its own, its first byte at `phase` in its
// page, when large; LibTorch's allocator otherwise.
at::Tensor allocate_slice(const std::vector<int64_t>& shape, c10::ScalarType type, uint64_t nbytes, uint64_t phase,
                          bool* mapped) {
  *mapped = nbytes >= detail::kOwnMappingBytes;
  if (*mapped) return detail::allocate_host_tensor(shape, type, phase);
  return at::empty(shape, at::TensorOptions().dtype(type));
}

// Fills jobs that are one run of their file, whole pages at a time, from read-only
// mappings of the files (cpu_loader.cpp's claim_pages, for slices).
class slice_filler {
 public:
  explicit slice_filler(const checkpoint& c) : c_(c), maps_(c.files.size()), tried_(c.files.size(), false) {}

  // Claims `job` (one span, contiguous, covering its whole slice of `nbytes`); false: it
  // is read with pread instead. The slice need not be congruent with the file: a copy's
  // source need not be page-aligned, only its destination (a DCP chunk's data lies at any
  // byte of its .distcp file, and LibTorch's 64-byte alignment keeps such a slice from
  // being placed congruent with it).
  bool claim(const slice_job& job, uint64_t nbytes) {
    if (!job.mapped || !job.whole || job.spans.size() != 1) return false;
    const slice_span& s = job.spans[0];
    if (s.dst != 0 || s.width * s.rows != nbytes || (s.rows > 1 && (s.src_pitch != s.width || s.dst_pitch != s.width)))
      return false;
    const byte_source& src = *c_.files[job.file].source;
    const file_extent where = src.in_file();
    if (!where.file || s.src + nbytes > src.size() || where.offset + s.src + nbytes > where.file->size()) return false;
    if (!filler_ && !opened_) {
      opened_ = true;
      filler_ = detail::page_filler::open();
    }
    if (!filler_ || !map(job.file)) return false;
    const uintptr_t first = page_floor(reinterpret_cast<uintptr_t>(job.base));
    return filler_->add(reinterpret_cast<void*>(first), size_t(page_ceil(reinterpret_cast<uintptr_t>(job.base) + nbytes) - first));
  }

  // Bytes [offset, offset + n) of the job's file (its one span) into their place, as whole
  // pages. Items are cut at page boundaries of the slice (execute), so only the slice's
  // own first and last pages are partial: page_filler::fill_part reads them, the bytes
  // outside the slice (its mapping's own, no tensor's) left zero.
  void fill(const slice_job& job, uint64_t offset, uint64_t n) {
    const slice_span& s = job.spans[0];
    const uintptr_t dst = reinterpret_cast<uintptr_t>(job.base) + (offset - s.src);
    const uintptr_t end = dst + n;
    const byte_source& src = *c_.files[job.file].source;
    const uint8_t* from = maps_[job.file].get() + src.in_file().offset + offset;  // lands at dst
    const uintptr_t whole_from = std::min<uintptr_t>(page_ceil(dst), end);
    const uintptr_t whole_to = std::max<uintptr_t>(page_floor(end), whole_from);
    auto edge = [&](uintptr_t lo, uintptr_t hi) {  // [lo, hi) within one page
      filler_->fill_part(reinterpret_cast<void*>(page_floor(lo)), size_t(lo % kPageBytes), src, offset + (lo - dst),
                         size_t(hi - lo));
    };
    if (whole_from > dst) edge(dst, whole_from);
    if (whole_to > whole_from) {
      filler_->fill(reinterpret_cast<void*>(whole_from), from + (whole_from - dst), size_t(whole_to - whole_from));
      src.count_read(whole_to - whole_from);
      // The file's pages were mapped into this process on the way: unmapped, or they would
      // count in its resident memory on top of the copy.
      const uintptr_t lo = page_floor(reinterpret_cast<uintptr_t>(from + (whole_from - dst)));
      const uintptr_t hi = page_ceil(reinterpret_cast<uintptr_t>(from + (whole_to - dst)));
      ::madvise(reinterpret_cast<void*>(lo), size_t(hi - lo), MADV_DONTNEED);
    }
    if (end > whole_to) edge(whole_to, end);
  }

  // The rows of a `rows` read (far apart in the file: a Shard(1) slice) copied from the
  // file's mapping: a pread per row costs more than its copy for rows of a few KB, and
  // the mapping faults in 16 pages at a time (fault-around). False: read them with pread.
  // Only the rows' bytes are copied (and counted); the pages are unmapped afterwards, as
  // in fill(). A file truncated meanwhile raises SIGBUS, as under --mmap (cli/sigbus.cpp).
  bool copy_rows(const slice_job& job, const slice_span& s, uint64_t first_row, uint64_t row_count) {
    const byte_source& src = *c_.files[job.file].source;
    const file_extent where = src.in_file();
    const uint64_t begin = s.src + first_row * s.src_pitch;
    const uint64_t end = s.src + (first_row + row_count - 1) * s.src_pitch + s.width;
    if (!where.file || end > src.size() || where.offset + end > where.file->size()) return false;
    if (!mapped(job.file)) return false;
    const uint8_t* from = maps_[job.file].get() + where.offset;
    for (uint64_t r = first_row; r < first_row + row_count; ++r)
      std::memcpy(job.base + s.dst + r * s.dst_pitch, from + s.src + r * s.src_pitch, size_t(s.width));
    const uint64_t lo = page_floor(where.offset + begin), hi = page_ceil(where.offset + end);
    ::madvise(const_cast<uint8_t*>(maps_[job.file].get()) + lo, size_t(hi - lo), MADV_DONTNEED);
    src.count_read(row_count * s.width);
    return true;
  }

 private:
  bool mapped(uint32_t file) {
    std::lock_guard<std::mutex> lock(mutex_);
    return map(file);
  }

  bool map(uint32_t file) {
    if (tried_[file]) return bool(maps_[file]);
    tried_[file] = true;
    const file_source* fs = c_.files[file].source->in_file().file;
    maps_[file] = detail::map_whole_file(fs->fd(), fs->size());
    return bool(maps_[file]);
  }

  const checkpoint& c_;
  std::vector<std::shared_ptr<uint8_t>> maps_;
  std::vector<bool> tried_;
  std::mutex mutex_;  // map() from the reading threads
  bool opened_ = false;
  // Last: destroyed first, so that no claimed page outlives its registration unfilled.
  std::unique_ptr<detail::page_filler> filler_;
};

// Runs every read of every job; returns the bytes read.
uint64_t execute(const checkpoint& c, const std::vector<slice_job>& jobs, const load_options& o) {
  const detail::slice_read_options ro;
  std::vector<read_item> items;
  uint64_t total = 0;
  slice_filler filler(c);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const slice_job& job = jobs[j];
    const uint64_t nbytes = detail::span_bytes(job.spans);
    if (filler.claim(job, nbytes)) {
      // Cut where the slice's addresses are multiples of kFillBytes (page boundaries), so
      // no two items share a page.
      const uint64_t origin = reinterpret_cast<uintptr_t>(job.base) - job.spans[0].src;  // address of file offset 0
      const uint64_t begin = job.spans[0].src, end = begin + nbytes;
      for (uint64_t at = begin; at < end;) {
        const uint64_t next = std::min(end, (origin + at) / kFillBytes * kFillBytes + kFillBytes - origin);
        slice_read r;
        r.offset = at;
        r.nbytes = next - at;
        items.push_back({j, r, true});
        at = next;
      }
      total += nbytes;
      continue;
    }
    for (const slice_read& r : detail::plan_slice_reads(job.spans, ro)) {
      items.push_back({j, r, false});
      total += r.nbytes;
    }
  }
  bounce_pool pool(ro.max_read);
  std::atomic<uint64_t> done{0};
  detail::for_each_piece(items.size(), detail::loader_threads(o), [&](size_t i) {
    const read_item& it = items[i];
    const slice_job& job = jobs[it.job];
    const slice_span& s = job.spans[it.read.span];
    const byte_source& file = *c.files[job.file].source;
    if (it.fill) {
      filler.fill(job, it.read.offset, it.read.nbytes);
      const uint64_t now = done += it.read.nbytes;
      if (o.progress) o.progress(now, total);
      return;
    }
    // The slice's rows of this read, contiguous in the slice: faulted in at once.
    if (job.mapped) {
      const uint64_t first = s.dst + it.read.first_row * s.dst_pitch;
      const uint64_t last = s.dst + (it.read.first_row + it.read.row_count - 1) * s.dst_pitch + s.width;
      if (it.read.how == slice_read::mode::direct)
        detail::prefault_for_write(job.base + s.dst + (it.read.offset - s.src), size_t(it.read.nbytes));
      else
        detail::prefault_for_write(job.base + first, size_t(last - first));
    }
    switch (it.read.how) {
      case slice_read::mode::direct:
        file.read_exact(it.read.offset, job.base + s.dst + (it.read.offset - s.src), size_t(it.read.nbytes));
        break;
      case slice_read::mode::rows:
        if (filler.copy_rows(job, s, it.read.first_row, it.read.row_count)) break;
        for (uint64_t r = it.read.first_row; r < it.read.first_row + it.read.row_count; ++r)
          file.read_exact(s.src + r * s.src_pitch, job.base + s.dst + r * s.dst_pitch, size_t(s.width));
        break;
      case slice_read::mode::bounce: {
        std::unique_ptr<uint8_t[]> b = pool.take(it.read.nbytes);
        file.read_exact(it.read.offset, b.get(), size_t(it.read.nbytes));
        for (uint64_t k = 0; k < it.read.row_count; ++k) {
          const uint64_t r = it.read.first_row + k;
          std::memcpy(job.base + s.dst + r * s.dst_pitch, b.get() + k * s.src_pitch, size_t(s.width));
        }
        pool.give(std::move(b));
        break;
      }
    }
    const uint64_t now = done += it.read.nbytes;
    if (o.progress) o.progress(now, total);
  });
  return total;
}

at::Tensor cast(at::Tensor t, const load_options& o, const std::string& name, std::vector<std::string>& converted) {
  if (!o.dtype || !at::isFloatingType(t.scalar_type()) || t.scalar_type() == *o.dtype) return t;
  converted.push_back(name + ": " + c10::getDtypeNames(t.scalar_type()).first + " -> " +
                      c10::getDtypeNames(*o.dtype).first);
  return t.to(*o.dtype);
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> load_tensors(const checkpoint& c, const load_options& o,
                                                          const slice_selection& sel, slice_load_report* report) {
  slice_load_report local;
  slice_load_report& r = report ? *report : local;
  r = slice_load_report{};
  if (o.mmap) throw error(errc::usage, "--mmap cannot load slices: a slice is not one range of the file");
  if (sel.world < 1 || sel.rank < 0 || sel.rank >= sel.world)
    throw error(errc::usage, "rank " + std::to_string(sel.rank) + " is not in a world of " + std::to_string(sel.world));
  detail::check_device(o.device);
  const bool meta = o.device.is_meta();
  std::vector<detail::named_tensor> names = detail::named_tensors(c);
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::vector<slice_job> jobs;
  std::vector<size_t> whole_records, whole_slots;  // loaded by the ordinary loader
  std::unordered_map<std::string, size_t> first_of;  // "record placement" -> its slot in out
  std::vector<std::pair<size_t, size_t>> alias_of;    // (slot, slot of the same slice)
  const detail::selection_matcher matcher(sel);
  for (detail::named_tensor& n : names) {
    const std::optional<placement> p = matcher.match(n.name);
    if (!p) {
      ++r.left_out;
      continue;
    }
    const std::string what = "key '" + n.name + "'";
    // Tied weights with one placement are one slice under every name, read once and still
    // tied: one tensor object saved under two names, or two objects viewing the same bytes
    // alike (state_dict() of tied modules gives one object per module).
    if (!n.assembled) {
      auto [it, fresh] = first_of.emplace(same_view_key(c.tensors[n.tensor], n.tensor) + " " + placement_text(*p),
                                          out.size());
      if (!fresh) {
        ++(p->type == placement::kind::replicate ? r.whole : r.sliced);
        alias_of.emplace_back(out.size(), it->second);
        out.emplace_back(std::move(n.name), at::Tensor());
        continue;
      }
    }
    tensor_source src = source_of(c, n);
    const std::vector<dim_range> box = slice_box(*p, src.shape, sel.rank, sel.world, what);
    const uint64_t e = element_size(src.type);
    r.full_bytes += box_numel(whole_box(src.shape)) * e;
    r.slice_bytes += box_numel(box) * e;
    if (p->type == placement::kind::replicate) ++r.whole; else ++r.sliced;
    if (!src.unsliceable.empty()) {
      if (p->type != placement::kind::replicate)
        throw_unsupported(what + ": " + placement_text(*p) + " cannot be read as a slice because " + src.unsliceable +
                          "; only Replicate() loads it (whole)");
      whole_records.push_back(n.tensor);
      whole_slots.push_back(out.size());
      out.emplace_back(std::move(n.name), at::Tensor());
      continue;
    }
    std::vector<int64_t> shape;
    for (const dim_range& d : box) shape.push_back(d.length);
    const c10::ScalarType st = detail::scalar_type(src.type);
    std::vector<slice_job> mine;
    std::vector<slice_span> all;
    for (const stored_piece& piece : src.pieces) {
      slice_job job;
      job.file = piece.file;
      detail::intersect_piece(box, piece.box, e, piece.offset, job.spans);
      if (job.spans.empty()) continue;
      if (piece.unopened) {
        std::vector<int64_t> at;
        for (const dim_range& d : piece.box) at.push_back(d.start);
        throw_unsupported(what + ": its chunk at offsets " + text::shape(at) +
                          " holds part of this rank's slice, but its archive was not opened (a metadata-only open, "
                          "or open_options::open_chunk declined it)");
      }
      all.insert(all.end(), job.spans.begin(), job.spans.end());
      mine.push_back(std::move(job));
    }
    at::Tensor t;
    bool mapped = false;
    if (meta) {
      t = at::empty(shape, at::TensorOptions().dtype(st).device(c10::kMeta));
    } else {
      // Congruent with the file where the slice's first byte lies (a page-aligned source
      // keeps the offsets' phase: in_file().offset is checked where it matters).
      uint64_t phase = 0;
      if (!mine.empty() && !mine[0].spans.empty())
        phase = (c.files[mine[0].file].source->in_file().offset + mine[0].spans[0].src) % detail::kPageBytes;
      t = allocate_slice(shape, st, box_numel(box) * e, phase, &mapped);
    }
    if (!meta && t.numel())
      for (slice_job& job : mine) {
        job.base = static_cast<uint8_t*>(t.data_ptr());
        job.mapped = mapped;
        job.whole = mine.size() == 1;
        jobs.push_back(std::move(job));
      }
    // Pieces cover their tensor exactly (plan_assembly), so they cover every slice of it.
    if (detail::span_bytes(all) != box_numel(box) * e)
      throw_corrupt(what + ": its pieces hold " + std::to_string(detail::span_bytes(all)) + " of the " +
                    std::to_string(box_numel(box) * e) + " bytes of its slice");
    // The slice holds the stored bytes; the record's bits make them its values.
    if (!n.assembled && t.defined()) detail::set_tensor_bits(t, c.tensors[n.tensor]);
    out.emplace_back(std::move(n.name), std::move(t));
  }
  if (!meta) r.bytes_read += execute(c, jobs, o);
  for (auto& [name, t] : out)
    if (t.defined()) {
      if (!meta && !o.device.is_cpu()) t = t.to(o.device);
      t = cast(std::move(t), o, name, r.converted);
    }
  if (!whole_records.empty()) {
    const std::vector<bool> needed = detail::storages_of(c, whole_records);
    for (size_t i = 0; i < needed.size(); ++i)
      if (needed[i] && !meta) r.bytes_read += c.storages[i].nbytes;
    std::vector<at::Tensor> storages = detail::load_storages(c, needed, o);
    for (size_t k = 0; k < whole_records.size(); ++k) {
      auto& slot = out[whole_slots[k]];
      slot.second = cast(detail::view_of(c.tensors[whole_records[k]], storages, o.device), o, slot.first, r.converted);
    }
  }
  for (const auto& [slot, same] : alias_of) out[slot].second = out[same].second;
  return out;
}

}  // namespace ckpt
