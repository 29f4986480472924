// load_options::mmap and ::populate (src/torch/loader/storage_loader.cpp): a mapped load is lazy
// unless asked to populate, and populating maps every page of the tensors without copying
// them. The page table is read from /proc/self/pagemap (bit 63: page present), which an
// unprivileged process may read for its own pages.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "torch_doctest.h"

#include "ckpt/load.h"
#include "torch/loader/storage_loader.h"

namespace {

// Pages of [p, p + n) that are present in this process's page table.
size_t present_pages(const void* p, size_t n) {
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / page;
  const uint64_t last = (reinterpret_cast<uintptr_t>(p) + n - 1) / page;
  std::vector<uint64_t> entries(last - first + 1);
  const ssize_t want = ssize_t(entries.size() * sizeof(uint64_t));
  const bool read_all = ::pread(fd, entries.data(), size_t(want), off_t(first * sizeof(uint64_t))) == want;
  ::close(fd);
  REQUIRE(read_all);
  size_t present = 0;
  for (uint64_t e : entries) present += (e >> 63) & 1;
  return present;
}

size_t pages_of(const at::Tensor& t) {
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uintptr_t>(t.data_ptr()) / page;
  const uint64_t end = (reinterpret_cast<uintptr_t>(t.data_ptr()) + t.nbytes() - 1) / page;
  return size_t(end - begin + 1);
}

struct temp_checkpoint {
  std::string path = "/tmp/ckpt_mmap_test_" + std::to_string(::getpid()) + ".pt";
  at::Tensor weight = at::arange(int64_t(3) << 20, at::kFloat);  // 12 MiB
  at::Tensor bias = at::full({4097}, 2.5, at::kDouble);
  temp_checkpoint() { ckpt::save_tensors({{"weight", weight}, {"bias", bias}}, path); }
  ~temp_checkpoint() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("a mapped load is lazy unless populate is set, and equal to the saved tensors either way") {
  temp_checkpoint ck;
  for (bool populate : {false, true}) {
    CAPTURE(populate);
    ckpt::load_options o;
    o.mmap = true;
    o.populate = populate;
    o.threads = 2;
    auto tensors = ckpt::load_tensors(ck.path, o);
    REQUIRE(tensors.size() == 2);
    for (const auto& entry : tensors) {
      const std::string& name = entry.first;  // CAPTURE's lambda cannot capture a binding
      const at::Tensor& t = entry.second;
      CAPTURE(name);
      size_t present = present_pages(t.data_ptr(), t.nbytes());
      if (populate) {
        CHECK(present == pages_of(t));
      } else {
        // Nothing touched yet; the kernel may map a few pages around the zip headers read
        // through the same file, never the bulk of a 12 MiB tensor.
        CHECK(present < pages_of(t) / 2 + 2);
      }
    }
    CHECK(at::equal(tensors[0].second, ck.weight));
    CHECK(at::equal(tensors[1].second, ck.bias));
  }
}

TEST_CASE("writing to a populated mapped tensor copies the page and leaves the file alone") {
  temp_checkpoint ck;
  ckpt::load_options o;
  o.mmap = true;
  o.populate = true;
  auto tensors = ckpt::load_tensors(ck.path, o);
  tensors[0].second.fill_(-1);
  auto again = ckpt::load_tensors(ck.path, o);
  CHECK(at::equal(again[0].second, ck.weight));
}

TEST_CASE("for_each_piece runs every piece once, and stops at the first failure") {
  std::vector<std::atomic<int>> calls(1000);
  ckpt::detail::for_each_piece(calls.size(), 4, [&](size_t i) { calls[i]++; });
  bool each_once = true;
  for (auto& c : calls) each_once = each_once && c.load() == 1;
  CHECK(each_once);

  std::atomic<size_t> ran{0};
  CHECK_THROWS_WITH_AS(ckpt::detail::for_each_piece(10000000, 4,
                                                     [&](size_t i) {
                                                       ran++;
                                                       if (i == 10) throw std::runtime_error("piece 10");
                                                     }),
                       "piece 10", std::runtime_error);
  CHECK(ran.load() < 10000000);  // pieces not yet started when piece 10 failed never ran
}
