// The CUDA path of load_storages: file -> a small ring of pinned host buffers (pread
// straight into them) -> asynchronous host-to-device copies on a dedicated stream, with
// an event per buffer gating its reuse. The checkpoint is never pinned as a whole, and
// host memory stays bounded by the ring. Neighbouring records are coalesced into one read
// (torch.save leaves only a local header between them), so small tensors do not cost a
// system call and a copy launch each.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "../storage_loader.h"
#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

// Bytes between two records that may be read and thrown away rather than split the read:
// a zip local header with its padding is under 200 bytes.
constexpr uint64_t kMaxGap = 4096;

struct piece {
  size_t storage;
  uint64_t in_segment;  // offset of the piece within the segment's bytes
  uint64_t in_storage;  // offset of the piece within its storage
  uint64_t size;
};

struct segment {
  uint64_t file_offset = 0;
  uint64_t size = 0;
  std::vector<piece> pieces;
};

std::vector<segment> plan_segments(const checkpoint& c, const std::vector<bool>& needed, uint64_t max_bytes) {
  std::vector<size_t> order;
  for (size_t i = 0; i < c.storages.size(); ++i)
    if (needed[i] && c.storages[i].file_offset && c.storages[i].nbytes) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return *c.storages[a].file_offset < *c.storages[b].file_offset; });
  std::vector<segment> out;
  for (size_t i : order) {
    const auto& s = c.storages[i];
    for (uint64_t b = 0; b < s.nbytes; b += max_bytes) {
      uint64_t size = std::min(max_bytes, s.nbytes - b);
      uint64_t at = *s.file_offset + b;
      if (!out.empty()) {
        segment& last = out.back();
        uint64_t end = last.file_offset + last.size;
        if (at >= end && at - end <= kMaxGap && at + size - last.file_offset <= max_bytes) {
          last.pieces.push_back({i, at - last.file_offset, b, size});
          last.size = at + size - last.file_offset;
          continue;
        }
      }
      segment seg;
      seg.file_offset = at;
      seg.size = size;
      seg.pieces.push_back({i, 0, b, size});
      out.push_back(std::move(seg));
    }
  }
  return out;
}

}  // namespace

std::vector<at::Tensor> load_storages_cuda(const checkpoint& c, const std::vector<bool>& needed,
                                           const load_options& o) {
  c10::cuda::CUDAGuard guard(o.device);
  const c10::DeviceIndex index = c10::cuda::current_device();
  const auto device_opts = at::TensorOptions().dtype(at::kByte).device(c10::Device(c10::kCUDA, index));

  std::vector<at::Tensor> dst(c.storages.size());
  uint64_t total = 0;
  for (size_t i = 0; i < c.storages.size(); ++i) {
    if (!needed[i]) continue;
    dst[i] = at::empty({int64_t(c.storages[i].nbytes)}, device_opts);
    total += c.storages[i].nbytes;
  }
  const uint64_t slot_bytes = std::max<uint64_t>(o.chunk_bytes, 1 << 20);
  std::vector<segment> segments = plan_segments(c, needed, slot_bytes);
  if (segments.empty()) return dst;

  const int slots = std::max(2, o.ring_slots);
  at::Tensor ring = at::empty({int64_t(slots * slot_bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  uint8_t* ring_base = ring.data_ptr<uint8_t>();
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  const size_t slot_count = size_t(slots);
  std::vector<at::cuda::CUDAEvent> events(slot_count);
  std::vector<char> in_flight(slot_count, 0);

  std::mutex pool_mutex, issue_mutex;
  std::condition_variable pool_cv;
  std::deque<int> free_slots;
  for (int s = 0; s < slots; ++s) free_slots.push_back(s);
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::exception_ptr failure;

  auto work = [&] {
    c10::cuda::CUDAGuard thread_guard(index);
    for (size_t j = next++; j < segments.size(); j = next++) {
      int slot;
      {
        std::unique_lock<std::mutex> lock(pool_mutex);
        pool_cv.wait(lock, [&] { return !free_slots.empty(); });
        slot = free_slots.front();
        free_slots.pop_front();
      }
      try {
        // The previous copy out of this buffer must be finished before it is overwritten.
        if (in_flight[size_t(slot)]) events[size_t(slot)].synchronize();
        const segment& seg = segments[j];
        uint8_t* buf = ring_base + uint64_t(slot) * slot_bytes;
        c.source->read_exact(seg.file_offset, buf, size_t(seg.size));
        {
          std::lock_guard<std::mutex> lock(issue_mutex);
          c10::cuda::CUDAStreamGuard stream_guard(stream);
          for (const piece& p : seg.pieces) {
            at::Tensor from = ring.narrow(0, int64_t(uint64_t(slot) * slot_bytes + p.in_segment), int64_t(p.size));
            dst[p.storage].narrow(0, int64_t(p.in_storage), int64_t(p.size)).copy_(from, /*non_blocking=*/true);
          }
          events[size_t(slot)].record(stream);
          in_flight[size_t(slot)] = 1;
        }
        uint64_t now = done += seg.size;
        if (o.progress) o.progress(std::min(now, total), total);
      } catch (...) {
        std::lock_guard<std::mutex> lock(pool_mutex);
        if (!failure) failure = std::current_exception();
        next = segments.size();
      }
      {
        std::lock_guard<std::mutex> lock(pool_mutex);
        free_slots.push_back(slot);
      }
      pool_cv.notify_one();
    }
  };
  int threads = std::clamp(o.threads > 0 ? o.threads : 4, 1, slots);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  stream.synchronize();
  if (failure) std::rethrow_exception(failure);
  return dst;
}

namespace {
// Installs this loader in a program that links ckpt_torch_cuda whole (ckpt_torch_with_cuda).
[[maybe_unused]] const bool kInstalled = (set_cuda_loader(&load_storages_cuda), true);
}  // namespace

}  // namespace ckpt::detail
