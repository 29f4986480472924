// Storages of a megabyte and more, and runs of smaller ones that are neighbours in the
// file, get an anonymous mapping of their own instead of LibTorch's malloc-backed
// allocation, for reasons measured on a 2 GiB checkpoint from a warm page cache, 2 cores:
//  - Where the data pointer sits in its page matters: with the destination congruent to
//    the file offset modulo 4 KiB, the kernel copies each page-cache page into a single
//    destination page, 10-15% faster than malloc's page-offset-64 pointers.
//  - Such a mapping, untouched and page-aligned, can be filled by page_filler without
//    zeroing or faulting (page_filler.cpp), and a run of small storages by one copy: with
//    20,000 tensors of 53 KB, a read and a malloc each cost about as much as the copy.
// A block mapping lives until its last storage goes, so one small tensor kept alive keeps
// at most kBlockSpanBytes; torch.load(mmap=True) keeps the whole file in the same case.
// Transparent huge pages (MADV_HUGEPAGE) were measured too and left out: on VMs that
// return free memory to the host, every fresh 2 MiB page is backed again by the host
// while the guest zeroes it, which made loading 1.3-5x slower than with 4 KiB pages.
//
// Every storage stays an ordinary resizable CPU storage: it carries LibTorch's CPU
// allocator, so resize_() allocates the new bytes there and the old DataPtr's deleter
// releases ours.
#include "torch/loader/host_buffer.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "ckpt/error.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace ckpt::detail {
namespace {

struct mapping {
  void* base;
  size_t length;
  std::atomic<size_t> users;
};

void release(void* ctx) {
  auto* m = static_cast<mapping*>(ctx);
  if (m->users.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  ::munmap(m->base, m->length);
  delete m;
}

}  // namespace

host_block allocate_host_block(const host_member* members, size_t count) {
  host_block out;
  if (count == 0) return out;
  uint64_t first = members[0].offset;
  out.span = members[count - 1].offset + members[count - 1].nbytes - first;
  uint64_t phase = first % kPageBytes;
  out.congruent = phase % 64 == 0;
  if (!out.congruent) phase &= ~uint64_t(63);
  size_t length = size_t(page_ceil(phase + out.span));
  auto ctx = std::make_unique<mapping>();
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    if (errno == ENOMEM)
      throw error(errc::device, "out of memory on cpu: cannot allocate " + std::to_string(out.span) + " bytes");
    throw error(errc::io, std::string("mmap failed: ") + std::strerror(errno));
  }
  ctx->base = base;
  ctx->length = length;
  // One reference per member from the start: a failure below releases those not yet
  // handed out, and the mapping goes with the last member made.
  ctx->users.store(count, std::memory_order_relaxed);
  mapping* shared = ctx.release();
  out.data = static_cast<uint8_t*>(base) + phase;
  out.bytes.reserve(count);
  size_t owned = 0;  // references handed to DataPtrs, which release them themselves
  try {
    auto options = at::TensorOptions().dtype(at::kByte);
    for (size_t i = 0; i < count; ++i) {
      const host_member& m = members[i];
      c10::DataPtr data(out.data + (m.offset - first), shared, &release, c10::Device(c10::kCPU));
      ++owned;
      c10::Storage storage(c10::Storage::use_byte_size_t(), c10::SymInt(int64_t(m.nbytes)), std::move(data),
                           c10::GetCPUAllocator(), /*resizable=*/true);
      at::Tensor bytes = at::empty({0}, options);
      bytes.set_(std::move(storage), 0, {int64_t(m.nbytes)}, {1});
      out.bytes.push_back(std::move(bytes));
    }
  } catch (...) {
    for (size_t i = owned; i < count; ++i) release(shared);
    throw;
  }
  return out;
}

at::Tensor allocate_host_tensor(at::IntArrayRef shape, at::ScalarType type, uint64_t phase) {
  uint64_t nbytes = c10::elementSize(type);
  for (int64_t n : shape) nbytes *= uint64_t(n);
  if (nbytes == 0) return at::empty(shape, at::TensorOptions().dtype(type));  // no mapping of no bytes
  const host_member m{phase % kPageBytes, nbytes};
  return allocate_host_block(&m, 1).bytes[0].view(type).view(shape);
}

void prefault_for_write(void* p, size_t n) {
  // One call faults the range in kernel space: cheaper than a fault per page from inside
  // the read. Failure (kernels before 5.14) just leaves the faults to the read.
  auto start = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(kPageBytes - 1);
  auto end = reinterpret_cast<uintptr_t>(p) + n;
  if (end > start) ::madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE);
}

}  // namespace ckpt::detail
