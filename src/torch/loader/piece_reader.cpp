// The CPU path for the pieces of assembled tensors (assembly.h): the read plan of the
// piece storages, executed by a few threads. A read that is one piece whose box is
// contiguous in its tensor (a dim-0 shard, a whole tensor) goes straight into the tensor,
// its pages faulted in by one call first, as cpu_loader does (faults taken a page at a time
// inside the read were 12% of the CPU profile of a 2 GiB DCP load);
// any other read goes into a bounce buffer of at most kBounceBytes, then its runs are
// copied into the strided box. Each byte is read once, and memory beyond the tensors is
// bounded by a bounce buffer per thread.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "model/read_plan.h"
#include "torch/loader/host_buffer.h"
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

}  // namespace

void land_pieces_cpu(const checkpoint& c, const piece_targets& t, const load_options& o, uint64_t progress_base,
                     uint64_t progress_total) {
  std::vector<bool> needed(c.storages.size(), false);
  for (size_t i = 0; i < c.storages.size(); ++i) needed[i] = t.base[i] != nullptr;
  const read_plan plan = plan_reads(c, needed, piece_plan_options());
  bounce_pool pool;
  std::atomic<uint64_t> done{progress_base};
  for_each_piece(plan.reads.size(), loader_threads(o), [&](size_t j) {
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
    const uint64_t now = done += landed;
    if (o.progress) o.progress(now, progress_total);
  });
}

}  // namespace ckpt::detail
