// The CPU path of load_storages: each storage allocated once (host_buffer.cpp) and filled
// straight from the file by a few threads, in file order.
//  - Storages are grouped into blocks, one mapping each: a large storage alone, or a run
//    of small neighbours in the file laid out as in the file, so one copy fills the run
//    (a read and a malloc per storage cost as much as the copy for 20,000 tensors of 53 KB).
//  - Blocks are cut into page-aligned pieces so every thread copies; each piece is filled
//    with UFFDIO_COPY from a mapping of the file where the kernel allows
//    (page_filler.cpp), else faulted in at once and read with pread.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "ckpt/error.h"
#include "host_buffer.h"
#include "page_filler.h"
#include "storage_loader.h"

namespace ckpt::detail {
namespace {

constexpr uint64_t kPieceBytes = 16ull << 20;  // large enough to amortize, small enough to share out
constexpr uint64_t kMaxGap = 4096;             // file bytes between neighbours of a block (zip headers)

uint64_t page_floor(uint64_t n) { return n & ~(kPageBytes - 1); }
uint64_t page_ceil(uint64_t n) { return page_floor(n + kPageBytes - 1); }

// Bytes [begin, begin + size) of one block.
struct piece {
  size_t block;
  uint64_t begin;
  uint64_t size;
};

// File bytes [offset, offset + span) go to [data, data + span).
struct block {
  uint64_t offset;
  uint64_t span;
  uint8_t* data;
  bool mapped;           // a mapping of its own (host_block)
  bool own_pages;        // ... congruent to the file
  bool filled_by_pages;  // claimed by the page_filler
};

class cpu_loader {
 public:
  cpu_loader(const checkpoint& c, const std::vector<bool>& needed, const load_options& o) : c_(c), o_(o) {
    bytes_.resize(c.storages.size());
    std::vector<size_t> order;
    for (size_t i = 0; i < c.storages.size(); ++i) {
      if (!needed[i]) continue;
      const storage_record& s = c.storages[i];
      if (s.file_offset && s.nbytes)
        order.push_back(i);
      else
        bytes_[i] = at::empty({int64_t(s.nbytes)}, at::TensorOptions().dtype(at::kByte));
    }
    // File order: sequential reads, what the page cache and read-ahead like best.
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return *c.storages[a].file_offset < *c.storages[b].file_offset; });
    allocate(order);
    fs_ = dynamic_cast<const file_source*>(c.source.get());
    if (fs_) claim_pages();
    plan();
  }

  std::vector<at::Tensor> run() {
    for_each_piece(pieces_.size(), loader_threads(o_), [this](size_t j) {
      const piece& p = pieces_[j];
      read_piece(blocks_[p.block], p.begin, p.size);
      // Gap bytes inside a block are read but are no storage's: progress counts storages.
      uint64_t now = done_ += p.size;
      if (o_.progress) o_.progress(std::min(now, total_), total_);
    });
    return std::move(bytes_);
  }

 private:
  // Runs of small neighbours (64-byte aligned in the file, so each keeps LibTorch's
  // alignment in a block laid out like the file) share a block; the rest stand alone.
  void allocate(const std::vector<size_t>& order) {
    auto offset = [&](size_t i) { return *c_.storages[i].file_offset; };
    auto nbytes = [&](size_t i) { return c_.storages[i].nbytes; };
    auto small = [&](size_t i) { return nbytes(i) < kOwnMappingBytes && offset(i) % 64 == 0; };
    std::vector<host_member> members;
    for (size_t k = 0; k < order.size();) {
      size_t end = k + 1;
      if (small(order[k])) {
        while (end < order.size() && small(order[end])) {
          uint64_t prev_end = offset(order[end - 1]) + nbytes(order[end - 1]);
          uint64_t next = offset(order[end]);
          if (next < prev_end || next - prev_end > kMaxGap) break;
          if (next + nbytes(order[end]) - offset(order[k]) > kBlockSpanBytes) break;
          ++end;
        }
        if (end - k == 1) {
          // Alone, a small storage is not worth a mapping of its own.
          size_t i = order[k];
          bytes_[i] = at::empty({int64_t(nbytes(i))}, at::TensorOptions().dtype(at::kByte));
          blocks_.push_back({offset(i), nbytes(i), bytes_[i].data_ptr<uint8_t>(), false, false, false});
          total_ += nbytes(i);
          k = end;
          continue;
        }
      }
      members.clear();
      for (size_t j = k; j < end; ++j) members.push_back({offset(order[j]), nbytes(order[j])});
      host_block h = allocate_host_block(members.data(), members.size());
      for (size_t j = k; j < end; ++j) {
        bytes_[order[j]] = std::move(h.bytes[j - k]);
        total_ += nbytes(order[j]);
      }
      blocks_.push_back({members.front().offset, h.span, h.data, true, h.own_pages, false});
      k = end;
    }
  }

  // Congruent blocks of a file are claimed for the page_filler, with one read-only
  // mapping of the file as the source.
  void claim_pages() {
    if (std::none_of(blocks_.begin(), blocks_.end(), [](const block& b) { return b.own_pages; })) return;
    filler_ = page_filler::open();
    if (!filler_) return;
    size_t length = size_t(page_ceil(fs_->size()));
    void* m = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fs_->fd(), 0);
    if (m == MAP_FAILED) {
      filler_.reset();
      return;
    }
    file_map_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(m), [length](uint8_t* p) { ::munmap(p, length); });
    for (block& b : blocks_) {
      if (!b.own_pages || b.offset + b.span > fs_->size()) continue;
      uint64_t first = page_floor(reinterpret_cast<uintptr_t>(b.data));
      b.filled_by_pages = filler_->add(reinterpret_cast<void*>(first),
                                       size_t(page_ceil(reinterpret_cast<uintptr_t>(b.data) + b.span) - first));
    }
  }

  void plan() {
    for (size_t k = 0; k < blocks_.size(); ++k) {
      const block& b = blocks_[k];
      // Cut where the destination crosses a page boundary every kPieceBytes, so pieces
      // fill whole pages of their own.
      uint64_t phase = reinterpret_cast<uintptr_t>(b.data) % kPageBytes;
      for (uint64_t x = 0; x < b.span;) {
        uint64_t e = std::min(b.span, (phase + x) / kPieceBytes * kPieceBytes + kPieceBytes - phase);
        pieces_.push_back({k, x, e - x});
        x = e;
      }
    }
  }

  void read_piece(const block& b, uint64_t begin, uint64_t size) {
    if (b.filled_by_pages) {
      // Whole pages around the piece: bytes before the block's first storage and after
      // its last lie in its own mapping, unseen by any tensor.
      uint64_t dst = reinterpret_cast<uintptr_t>(b.data) + begin;
      uint64_t src = b.offset + begin;
      uint64_t lead = dst % kPageBytes;  // equals src % kPageBytes: the block is congruent
      uint64_t length = page_ceil(lead + size);
      uint8_t* from = file_map_.get() + (src - lead);
      filler_->fill(reinterpret_cast<void*>(dst - lead), from, size_t(length));
      // The source pages were mapped into this process on the way: unmap them, or the
      // process would count the file's pages in its resident memory on top of the copy.
      ::madvise(from, size_t(length), MADV_DONTNEED);
      c_.source->count_read(size);
      return;
    }
    if (b.mapped) prefault_for_write(b.data + begin, size_t(size));
    c_.source->read_exact(b.offset + begin, b.data + begin, size_t(size));
  }

  const checkpoint& c_;
  const load_options& o_;
  std::vector<at::Tensor> bytes_;
  std::vector<block> blocks_;
  std::vector<piece> pieces_;
  uint64_t total_ = 0;
  const file_source* fs_ = nullptr;
  std::shared_ptr<uint8_t> file_map_;
  // Declared after bytes_, so destroyed before: closing the userfaultfd drops every
  // registration, and nothing may be left waiting on a page nobody supplies.
  std::unique_ptr<page_filler> filler_;
  std::atomic<uint64_t> done_{0};
};

}  // namespace

std::vector<at::Tensor> load_storages_cpu(const checkpoint& c, const std::vector<bool>& needed, const load_options& o) {
  return cpu_loader(c, needed, o).run();
}

}  // namespace ckpt::detail
