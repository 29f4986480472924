// The CPU path of load_storages: executes the read plan (read_plan.h) into storages
// allocated once each (host_buffer.cpp), filled straight from the file by a few threads.
//  - The plan shares a read between runs of small neighbours (64-byte aligned in the
//    file); such a run gets one mapping laid out as in the file, so one copy fills it (a
//    read and a malloc per storage cost as much as the copy for 20,000 tensors of 53 KB).
//    A storage of kOwnMappingBytes and more gets a mapping of its own.
//  - The plan cuts long storages at multiples of kPieceBytes in the file, and the threads
//    fill the pages of a mapping with UFFDIO_COPY from a mapping of the file where the
//    kernel allows (page_filler.cpp), else fault them in at once and read with pread.
//    UFFDIO_COPY needs page-aligned destinations only, so a block not congruent with its
//    file is filled this way too: a safetensors tensor's data lies at any multiple of its
//    element size in the file (header length + offset), and LibTorch's 64-byte alignment
//    then wins over congruence. Each page of a block is filled by the one read holding
//    the page's first byte of the block, wherever the plan's cuts fall.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "ckpt/error.h"
#include "torch/loader/host_buffer.h"
#include "torch/loader/page_filler.h"
#include "model/read_plan.h"
#include "torch/loader/storage_loader.h"

namespace ckpt::detail {
namespace {

constexpr uint64_t kPieceBytes = 16ull << 20;  // large enough to amortize, small enough to share out

read_plan_options cpu_plan_options() {
  read_plan_options o;
  o.max_gap = 4096;  // zip local headers between records
  o.max_read = kPieceBytes;
  o.max_shared_read = kBlockSpanBytes;
  o.share_below = kOwnMappingBytes;
  o.share_alignment = 64;  // a block laid out as in the file keeps LibTorch's alignment
  return o;
}

// Bytes [offset, offset + span) of file `file` go to [data, data + span).
struct block {
  uint32_t file;
  uint64_t offset;
  uint64_t span;
  uint8_t* data;
  bool mapped;           // a mapping of its own (host_block): fresh pages the filler can claim
  bool filled_by_pages;  // claimed by the page_filler
};

// Where one read of the plan lands: bytes [begin, begin + nbytes) of a block.
struct destination {
  size_t block;
  uint64_t begin;
};

class cpu_loader {
 public:
  cpu_loader(const checkpoint& c, const std::vector<bool>& needed, const load_options& o)
      : c_(c), o_(o), plan_(plan_reads(c, needed, cpu_plan_options())) {
    bytes_.resize(c.storages.size());
    allocate();
    claim_pages();
  }

  std::vector<at::Tensor> run() {
    for_each_piece(plan_.reads.size(), loader_threads(o_), [this](size_t j) {
      const read_op& op = plan_.reads[j];
      read_into(blocks_[where_[j].block], where_[j].begin, op.nbytes);
      // Gap bytes inside a read are no storage's: progress counts storage bytes.
      uint64_t landed = 0;
      for (size_t p = op.first_piece; p < op.first_piece + op.piece_count; ++p) landed += plan_.pieces[p].nbytes;
      uint64_t now = done_ += landed;
      if (o_.progress) o_.progress(now, plan_.storage_bytes);
    });
    return std::move(bytes_);
  }

 private:
  // A read shared by several storages gets one block laid out as in the file; a storage
  // read alone (or cut into several reads) gets a block of its own: a mapping when it is
  // large, LibTorch's allocator when small.
  void allocate() {
    std::vector<size_t> block_of(c_.storages.size(), SIZE_MAX);
    std::vector<host_member> members;
    where_.reserve(plan_.reads.size());
    for (const read_op& op : plan_.reads) {
      const read_piece* pieces = plan_.pieces.data() + op.first_piece;
      if (op.piece_count > 1) {
        members.clear();
        for (size_t k = 0; k < op.piece_count; ++k) members.push_back({op.offset + pieces[k].read_offset, pieces[k].nbytes});
        host_block h = allocate_host_block(members.data(), members.size());
        for (size_t k = 0; k < op.piece_count; ++k) bytes_[pieces[k].storage] = std::move(h.bytes[k]);
        where_.push_back({blocks_.size(), 0});
        blocks_.push_back({op.file, op.offset, h.span, h.data, true, false});
        continue;
      }
      const size_t i = pieces[0].storage;
      const storage_record& s = c_.storages[i];
      if (block_of[i] == SIZE_MAX) {
        block_of[i] = blocks_.size();
        if (s.nbytes >= kOwnMappingBytes) {
          host_member m{*s.file_offset, s.nbytes};
          host_block h = allocate_host_block(&m, 1);
          bytes_[i] = std::move(h.bytes[0]);
          blocks_.push_back({s.file, *s.file_offset, s.nbytes, h.data, true, false});
        } else {
          bytes_[i] = at::empty({int64_t(s.nbytes)}, at::TensorOptions().dtype(at::kByte));
          blocks_.push_back({s.file, *s.file_offset, s.nbytes, bytes_[i].data_ptr<uint8_t>(), false, false});
        }
      }
      where_.push_back({block_of[i], pieces[0].storage_offset});
    }
    // Selected storages no read fills: zero-length ones, and those without data.
    for (size_t i : plan_.storages)
      if (!bytes_[i].defined()) bytes_[i] = at::empty({int64_t(c_.storages[i].nbytes)}, at::TensorOptions().dtype(at::kByte));
  }

  // Blocks in mappings of their own are claimed for the page_filler, with one read-only
  // mapping of each file (that is a file) as the source.
  void claim_pages() {
    if (std::none_of(blocks_.begin(), blocks_.end(), [](const block& b) { return b.mapped; })) return;
    filler_ = page_filler::open();
    if (!filler_) return;
    file_maps_.resize(c_.files.size());
    std::vector<bool> tried(c_.files.size(), false);
    for (block& b : blocks_) {
      if (!b.mapped) continue;
      const file_extent where = c_.files[b.file].source->in_file();
      if (!where.file || where.offset + b.offset + b.span > where.file->size()) continue;
      if (!tried[b.file]) {
        tried[b.file] = true;
        file_maps_[b.file] = map_whole_file(where.file->fd(), where.file->size());
      }
      if (!file_maps_[b.file]) continue;
      uint64_t first = page_floor(reinterpret_cast<uintptr_t>(b.data));
      b.filled_by_pages = filler_->add(reinterpret_cast<void*>(first),
                                       size_t(page_ceil(reinterpret_cast<uintptr_t>(b.data) + b.span) - first));
    }
  }

  void read_into(const block& b, uint64_t begin, uint64_t size) {
    if (b.filled_by_pages) return fill_pages(b, begin, size);
    if (b.mapped) prefault_for_write(b.data + begin, size_t(size));
    c_.files[b.file].source->read_exact(b.offset + begin, b.data + begin, size_t(size));
  }

  // Fills the pages of `b` whose first byte of the block lies in [begin, begin + size):
  // reads tile a block, so every page is filled once, by one thread. A page inside the
  // block is copied whole from the file's mapping (the source need not be page-aligned);
  // the block's first and last pages hold bytes outside it, which may lie outside the
  // source: those two go through page_filler::fill_part, their outside bytes left zero.
  void fill_pages(const block& b, uint64_t begin, uint64_t size) {
    const uintptr_t data = reinterpret_cast<uintptr_t>(b.data);
    const uintptr_t dst = data + begin, end = dst + size, block_end = data + b.span;
    const byte_source& source = *c_.files[b.file].source;
    const uint8_t* file = file_maps_[b.file].get() + source.in_file().offset + b.offset;  // lands at data
    uintptr_t page = (begin == 0 || dst % kPageBytes == 0) ? page_floor(dst) : page_ceil(dst);
    const uintptr_t stop = page_ceil(end);
    const uintptr_t touched_from = std::max(page, data);
    while (page < stop) {
      if (page < data || page + kPageBytes > block_end) {
        const uintptr_t lo = std::max(page, data), hi = std::min<uintptr_t>(page + kPageBytes, block_end);
        filler_->fill_part(reinterpret_cast<void*>(page), size_t(lo - page), source, b.offset + (lo - data),
                           size_t(hi - lo));
        page += kPageBytes;
        continue;
      }
      const uintptr_t run_end = std::min<uintptr_t>(stop, page_floor(block_end));
      filler_->fill(reinterpret_cast<void*>(page), file + (page - data), size_t(run_end - page));
      source.count_read(run_end - page);
      page = run_end;
    }
    // The file's pages were mapped into this process on the way: unmapped, or the process
    // would count them in its resident memory on top of the copy.
    const uintptr_t touched_to = std::min(stop, block_end);
    if (touched_to > touched_from) {
      const uintptr_t lo = page_floor(reinterpret_cast<uintptr_t>(file + (touched_from - data)));
      const uintptr_t hi = page_ceil(reinterpret_cast<uintptr_t>(file + (touched_to - data)));
      ::madvise(reinterpret_cast<void*>(lo), size_t(hi - lo), MADV_DONTNEED);
    }
  }

  const checkpoint& c_;
  const load_options& o_;
  const read_plan plan_;
  std::vector<at::Tensor> bytes_;
  std::vector<block> blocks_;
  std::vector<destination> where_;  // per read of the plan
  std::vector<std::shared_ptr<uint8_t>> file_maps_;  // by file: claim_pages' sources (whole files)
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
