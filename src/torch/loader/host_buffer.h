// Internal: CPU byte storages for the loader, placed so that reading a file range into
// them costs the kernel as little as possible.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace ckpt::detail {

constexpr uint64_t kPageBytes = 4096;
inline uint64_t page_floor(uint64_t n) { return n & ~(kPageBytes - 1); }
inline uint64_t page_ceil(uint64_t n) { return page_floor(n + kPageBytes - 1); }

/// Storages from this size up get a private anonymous mapping of their own (see
/// host_buffer.cpp); smaller ones come from LibTorch's allocator.
constexpr uint64_t kOwnMappingBytes = 1ull << 20;

/// Neighbours in the file that get one mapping between them, laid out as in the file
/// (see host_buffer.cpp): runs of small storages stop at this span.
constexpr uint64_t kBlockSpanBytes = 4ull << 20;

struct host_member {
  uint64_t offset;  // in the file; ascending, not overlapping
  uint64_t nbytes;
};

/// One anonymous mapping holding `members` at their distances in the file: the bytes
/// [data, data + span) mirror the file from members[0].offset, so a single read fills
/// them all. Each member is an ordinary resizable CPU storage; the mapping goes when the
/// last of them does.
struct host_block {
  std::vector<at::Tensor> bytes;  // uint8, one per member
  uint8_t* data = nullptr;
  uint64_t span = 0;
  // The pages [page_floor(data), page_ceil(data + span)) are the block's alone and
  // untouched, as page_filler needs. The data pointer is congruent to members[0].offset
  // modulo the page size (the kernel's copy is cheapest then), except when that offset is
  // not 64-byte aligned: LibTorch's 64-byte alignment wins, and `congruent` is false.
  bool congruent = false;
};

host_block allocate_host_block(const host_member* members, size_t count);

/// An uninitialized contiguous CPU tensor in a mapping of its own (fresh pages, as a
/// storage of kOwnMappingBytes and more gets), its first byte `phase` bytes into its first
/// page, rounded down to a multiple of 64 (LibTorch's alignment).
at::Tensor allocate_host_tensor(at::IntArrayRef shape, at::ScalarType type, uint64_t phase);

/// Faults in [p, p + n) for writing in one call where the kernel can
/// (MADV_POPULATE_WRITE, Linux 5.14); a no-op elsewhere.
void prefault_for_write(void* p, size_t n);

}  // namespace ckpt::detail
