// The loader's own CPU storages (src/torch/loader/host_buffer.cpp): laid out like the file, each
// an ordinary resizable CPU storage, the shared mapping freed with the last of them (the
// ASan build checks the freeing).
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "torch_doctest.h"

#include "torch/loader/host_buffer.h"

using namespace ckpt::detail;

TEST_CASE("a block mirrors the file's layout, congruent to it, 64-byte aligned") {
  std::vector<host_member> members = {{4096 + 192, 1000}, {4096 + 1216, 64}, {4096 + 1344, 70000}};
  host_block b = allocate_host_block(members.data(), members.size());
  REQUIRE(b.bytes.size() == 3);
  CHECK(b.congruent);
  CHECK(b.span == 1344 + 70000 - 192);
  CHECK(reinterpret_cast<uintptr_t>(b.data) % kPageBytes == 192);
  for (size_t i = 0; i < 3; ++i) {
    const at::Tensor& t = b.bytes[i];
    CHECK(t.device().is_cpu());
    CHECK((t.scalar_type() == at::kByte));
    CHECK(t.numel() == int64_t(members[i].nbytes));
    CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) == reinterpret_cast<uintptr_t>(b.data) + (members[i].offset - members[0].offset));
    CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 == 0);
  }
  b.bytes[2].fill_(7);
  CHECK(b.bytes[2].sum().item<int64_t>() == 7 * 70000);
}

TEST_CASE("members resize and free independently; the mapping goes with the last") {
  std::vector<host_member> members = {{0, 4096}, {4160, 8192}};
  host_block b = allocate_host_block(members.data(), members.size());
  at::Tensor first = b.bytes[0], second = b.bytes[1];
  b.bytes.clear();
  first.fill_(1);
  second.fill_(2);
  // Growing moves the bytes into LibTorch's allocator and gives our reference back.
  first.resize_({100000});
  CHECK(first.narrow(0, 0, 4096).sum().item<int64_t>() == 4096);
  first.narrow(0, 4096, 100000 - 4096).fill_(3);
  first.reset();
  CHECK(second.sum().item<int64_t>() == 2 * 8192);
  at::Tensor view = second.view(at::kFloat);  // the storage outlives the tensor it came from
  second.reset();
  CHECK(view.numel() == 2048);
}

TEST_CASE("an offset that is not 64-byte aligned keeps LibTorch's alignment, not congruence") {
  host_member m{4096 * 3 + 8, 3 << 20};
  host_block b = allocate_host_block(&m, 1);
  CHECK_FALSE(b.congruent);
  CHECK(reinterpret_cast<uintptr_t>(b.data) % 64 == 0);
  prefault_for_write(b.data, size_t(m.nbytes));
  b.bytes[0].fill_(9);
  CHECK(b.bytes[0].max().item<int64_t>() == 9);
}

TEST_CASE("a tensor of its own mapping: shape, dtype, phase in its page, writable, freed with it") {
  at::Tensor t = allocate_host_tensor({3, 5, 70000}, at::kBFloat16, 4096 * 7 + 1216);
  CHECK((t.scalar_type() == at::kBFloat16));
  CHECK((t.sizes() == at::IntArrayRef{3, 5, 70000}));
  CHECK(t.is_contiguous());
  CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % kPageBytes == 1216);
  // A phase that is not 64-byte aligned keeps LibTorch's alignment.
  at::Tensor u = allocate_host_tensor({1 << 20}, at::kFloat, 100);
  CHECK(reinterpret_cast<uintptr_t>(u.data_ptr()) % kPageBytes == 64);
  t.fill_(2);
  CHECK(t.eq(2).all().item<bool>());
  at::Tensor flat = t.view(-1);
  t.reset();
  CHECK(flat.numel() == 3 * 5 * 70000);
  CHECK(allocate_host_tensor({0, 4}, at::kFloat, 0).numel() == 0);
}
