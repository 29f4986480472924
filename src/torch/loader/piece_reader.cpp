// The CPU path for the pieces of assembled tensors (assembly.h): the read plan of the
// piece storages, executed by a few threads. Each byte is read once, and memory beyond the
// tensors is bounded by a bounce buffer per thread.
//  - A tensor of fresh pages (an own mapping, piece_targets::fresh_bytes) whose pieces are
//    all contiguous in it (dim-0 shards, whole tensors) is filled by the page filler, as
//    the single-file loader fills its storages: each page allocated and copied from a
//    mapping of the file in one step, with neither the fault nor the zeroing of a page
//    that pread would write (the pread path cost 1.3x the single file's load of the same
//    2 GiB: a DCP directory of 4 ranks). The copy's source need not be page-aligned, so
//    the pieces need not be congruent with the file; the pages a piece shares with its
//    neighbours (its first and last) are assembled from the file in a 4 KiB buffer and
//    filled whole once every piece's bytes in them are there.
//  - Otherwise a read that is one piece whose box is contiguous in its tensor goes
//    straight into the tensor, its pages faulted in by one call first, as cpu_loader does
//    (faults taken a page at a time inside the read were 12% of the CPU profile);
//    any other read goes into a bounce buffer of at most kBounceBytes, then its runs are
//    copied into the strided box.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "model/read_plan.h"
#include "torch/loader/host_buffer.h"
#include "torch/loader/page_filler.h"
#include "torch/loader/storage_loader.h"

namespace ckpt::detail {
namespace {

constexpr uint64_t kBounceBytes = 16ull << 20;

// Bounce buffers, one per thread at most: taken for a read, given back after.
class bounce_pool {
 public:
  std::unique_ptr<uint8_t[]> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) return std::unique_ptr<uint8_t[]>(new uint8_t[kBounceBytes]);
    auto b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void give(std::unique_ptr<uint8_t[]> b) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(b));
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<uint8_t[]>> free_;
};

read_plan_options piece_plan_options() {
  read_plan_options o;
  o.max_gap = 4096;
  o.max_read = kBounceBytes;  // cut at multiples in the file: a cut run is two spans
  // Small pieces share a read (one system call), landed from the bounce buffer.
  o.share_below = 1ull << 20;
  o.max_shared_read = kBounceBytes;
  return o;
}

// Piece bytes that land in a page other pieces (or no piece) share: copied into that
// page's buffer from file `file` at `offset`.
struct edge_segment {
  uint64_t page;     // the destination page's address
  uint32_t in_page;  // where in it the bytes go
  uint32_t nbytes;
  uint32_t file;
  uint64_t offset;  // in the checkpoint's file
};

// The tensors whose pages the page filler claims, their pieces, and the work that fills
// them: the whole pages inside each read of their plan, and the shared pages apart.
class claimed_pieces {
 public:
  // Claims what it can of `t`; `needed` (the piece storages) loses the claimed ones.
  claimed_pieces(const checkpoint& c, const piece_targets& t, std::vector<bool>& needed) : c_(c), t_(t) {
    if (t.fresh_bytes.empty()) return;
    std::map<uint8_t*, bool> fillable;  // by tensor (its first byte): every piece contiguous, in a mappable file
    for (size_t i = 0; i < c.storages.size(); ++i) {
      if (!needed[i] || !t.base[i]) continue;
      auto [it, added] = fillable.emplace(t.base[i], true);
      it->second = it->second && t.fresh_bytes[i] > 0 && t.boxes[i]->contiguous() && mappable(i);
    }
    if (std::none_of(fillable.begin(), fillable.end(), [](const auto& f) { return f.second; })) return;
    filler_ = page_filler::open();
    if (!filler_) return;
    std::vector<bool> claimed(c.storages.size(), false);
    std::map<uint8_t*, uint64_t> bytes;
    for (size_t i = 0; i < c.storages.size(); ++i)
      if (needed[i] && t.base[i] && fillable[t.base[i]]) bytes[t.base[i]] = t.fresh_bytes[i];
    for (const auto& [base, n] : bytes) {
      void* first = reinterpret_cast<void*>(page_floor(reinterpret_cast<uintptr_t>(base)));
      const size_t length = size_t(page_ceil(reinterpret_cast<uintptr_t>(base) + n) - page_floor(reinterpret_cast<uintptr_t>(base)));
      if (!filler_->add(first, length)) {
        filler_->remove(first, length);  // registered without the copy: a read could not write there
        fillable[base] = false;
      }
    }
    for (size_t i = 0; i < c.storages.size(); ++i) {
      if (!needed[i] || !t.base[i] || !fillable[t.base[i]]) continue;
      claimed[i] = true;
      needed[i] = false;
    }
    // Never shared: a read is one piece, so its whole pages come straight from the file.
    read_plan_options o = piece_plan_options();
    o.share_below = 0;
    plan_ = plan_reads(c, claimed, o);
    for (const read_op& op : plan_.reads) {
      const read_piece& p = plan_.pieces[op.first_piece];
      const uint64_t dst = reinterpret_cast<uintptr_t>(t.base[p.storage]) + t.boxes[p.storage]->offset + p.storage_offset;
      const uint64_t end = dst + op.nbytes;
      const uint64_t whole_from = std::min(page_ceil(dst), end), whole_to = std::max(page_floor(end), whole_from);
      if (whole_from > dst) edges_.push_back({page_floor(dst), uint32_t(dst % kPageBytes), uint32_t(whole_from - dst),
                                              op.file, op.offset});
      if (end > whole_to)
        edges_.push_back({whole_to, 0, uint32_t(end - whole_to), op.file, op.offset + (whole_to - dst)});
    }
    std::sort(edges_.begin(), edges_.end(), [](const edge_segment& a, const edge_segment& b) {
      return a.page != b.page ? a.page < b.page : a.in_page < b.in_page;
    });
    for (size_t k = 0; k < edges_.size(); ++k)
      if (k == 0 || edges_[k].page != edges_[k - 1].page) page_starts_.push_back(k);
  }

  size_t reads() const { return plan_.reads.size(); }
  size_t shared_pages() const { return page_starts_.size(); }

  // The whole pages of read j, copied from the file's mapping; returns the bytes landed.
  uint64_t fill_read(size_t j) {
    const read_op& op = plan_.reads[j];
    const read_piece& p = plan_.pieces[op.first_piece];
    const uint64_t dst = reinterpret_cast<uintptr_t>(t_.base[p.storage]) + t_.boxes[p.storage]->offset + p.storage_offset;
    const uint64_t end = dst + op.nbytes;
    const uint64_t from = std::min(page_ceil(dst), end), to = std::max(page_floor(end), from);
    if (to > from) {
      const byte_source& file = *c_.files[op.file].source;
      const uint8_t* src = maps_[op.file].get() + file.in_file().offset + op.offset + (from - dst);
      filler_->fill(reinterpret_cast<void*>(from), src, size_t(to - from));
      // The source pages were mapped into this process on the way: unmap them, or the
      // process would count the file's pages in its resident memory on top of the copy.
      const uint64_t s = page_floor(reinterpret_cast<uintptr_t>(src));
      ::madvise(reinterpret_cast<void*>(s), size_t(page_ceil(reinterpret_cast<uintptr_t>(src) + (to - from)) - s),
                MADV_DONTNEED);
      file.count_read(to - from);
    }
    return to - from;
  }

  // Shared page k, assembled from every piece's bytes in it (the bytes of the tensor's
  // mapping outside the tensor stay zero); returns the bytes landed.
  uint64_t fill_shared_page(size_t k) {
    alignas(64) uint8_t page[kPageBytes] = {};
    const size_t end = k + 1 < page_starts_.size() ? page_starts_[k + 1] : edges_.size();
    uint64_t landed = 0;
    for (size_t e = page_starts_[k]; e < end; ++e) {
      const edge_segment& s = edges_[e];
      c_.files[s.file].source->read_exact(s.offset, page + s.in_page, s.nbytes);
      landed += s.nbytes;
    }
    filler_->fill(reinterpret_cast<void*>(edges_[page_starts_[k]].page), page, kPageBytes);
    return landed;
  }

 private:
  // Whether storage i's bytes can be read through a mapping of its whole file (a file, the
  // range inside it); the mapping is made here, once per file.
  bool mappable(size_t i) {
    const storage_record& s = c_.storages[i];
    const file_extent where = c_.files[s.file].source->in_file();
    if (!where.file || !s.file_offset || where.offset + *s.file_offset + s.nbytes > where.file->size()) return false;
    if (maps_.empty()) maps_.resize(c_.files.size());
    if (!maps_[s.file]) maps_[s.file] = map_whole_file(where.file->fd(), where.file->size());
    return bool(maps_[s.file]);
  }

  const checkpoint& c_;
  const piece_targets& t_;
  std::vector<std::shared_ptr<uint8_t>> maps_;  // by file: whole-file read-only mappings
  read_plan plan_;
  std::vector<edge_segment> edges_;  // by page
  std::vector<size_t> page_starts_;  // the first of each page's segments
  // Last: closing it drops the registrations once nothing is filled any more.
  std::unique_ptr<page_filler> filler_;
};

}  // namespace

void land_pieces_cpu(const checkpoint& c, const piece_targets& t, const load_options& o, uint64_t progress_base,
                     uint64_t progress_total) {
  std::vector<bool> needed(c.storages.size(), false);
  for (size_t i = 0; i < c.storages.size(); ++i) needed[i] = t.base[i] != nullptr;
  claimed_pieces claimed(c, t, needed);
  const read_plan plan = plan_reads(c, needed, piece_plan_options());
  bounce_pool pool;
  std::atomic<uint64_t> done{progress_base};
  auto read_one = [&](size_t j) -> uint64_t {
    const read_op& op = plan.reads[j];
    const byte_source& file = *c.files[op.file].source;
    const read_piece& first = plan.pieces[op.first_piece];
    const box_landing& box = *t.boxes[first.storage];
    if (op.piece_count == 1 && box.contiguous()) {
      uint8_t* dst = t.base[first.storage] + box.offset + first.storage_offset;
      prefault_for_write(dst, size_t(op.nbytes));
      file.read_exact(op.offset, dst, size_t(op.nbytes));
    } else {
      std::unique_ptr<uint8_t[]> bounce = pool.take();
      file.read_exact(op.offset, bounce.get(), size_t(op.nbytes));
      for (size_t p = op.first_piece; p < op.first_piece + op.piece_count; ++p) {
        const read_piece& piece = plan.pieces[p];
        const uint8_t* src = bounce.get() + piece.read_offset;
        uint8_t* dst = t.base[piece.storage];
        for_each_span(*t.boxes[piece.storage], piece.storage_offset, piece.nbytes, [&](const box_span& s) {
          const uint8_t* from = src + (s.piece_offset - piece.storage_offset);
          for (uint64_t row = 0; row < s.rows; ++row)
            std::memcpy(dst + s.dst_offset + row * s.pitch, from + row * s.width, size_t(s.width));
        });
      }
      pool.give(std::move(bounce));
    }
    uint64_t landed = 0;
    for (size_t p = op.first_piece; p < op.first_piece + op.piece_count; ++p) landed += plan.pieces[p].nbytes;
    return landed;
  };
  // The filler's reads first, then its shared pages, then the plain reads.
  const size_t fills = claimed.reads(), shared = claimed.shared_pages();
  for_each_piece(fills + shared + plan.reads.size(), loader_threads(o), [&](size_t j) {
    const uint64_t landed = j < fills ? claimed.fill_read(j)
                            : j < fills + shared ? claimed.fill_shared_page(j - fills)
                                                 : read_one(j - fills - shared);
    const uint64_t now = done += landed;
    if (o.progress) o.progress(now, progress_total);
  });
}

}  // namespace ckpt::detail
