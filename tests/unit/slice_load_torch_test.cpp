// The loaders on a checkpoint embedded in a larger file (a DCP chunk in a .distcp): the
// mapped load maps the file and points into it, the CPU loader's page filler serves a
// slice that starts on a page and copies otherwise; every path gives the saved bytes.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "torch_doctest.h"

#include "ckpt/checkpoint.h"
#include "ckpt/load.h"
#include "io/slice_source.h"
#include "torch/loader/storage_loader.h"

namespace {

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("every loader reads a checkpoint embedded in a file at an aligned or unaligned offset") {
  const std::string pid = std::to_string(::getpid());
  const std::string inner = "/tmp/ckpt_slice_inner_" + pid + ".pt", outer = "/tmp/ckpt_slice_outer_" + pid + ".distcp";
  const at::Tensor weight = at::arange(int64_t(1) << 20, at::kFloat);  // 4 MiB: large enough for own pages
  const at::Tensor bias = at::full({4097}, 2.5, at::kDouble);
  ckpt::save_tensors({{"weight", weight}, {"bias", bias}}, inner);
  const std::vector<uint8_t> archive = file_bytes(inner);
  std::remove(inner.c_str());
  const ckpt::checkpoint direct = ckpt::open_checkpoint(std::make_unique<ckpt::memory_source>(archive));

  for (uint64_t pad : {uint64_t(3) * 4096, uint64_t(1577)}) {
    CAPTURE(pad);
    {
      std::vector<uint8_t> file(pad, 0x5a);
      file.insert(file.end(), archive.begin(), archive.end());
      file.insert(file.end(), 5000, 0xa5);  // the next chunk's bytes
      std::ofstream(outer, std::ios::binary).write(reinterpret_cast<const char*>(file.data()), long(file.size()));
    }
    auto parent = std::make_shared<ckpt::file_source>(outer);
    const ckpt::checkpoint c =
        ckpt::open_checkpoint(std::make_unique<ckpt::slice_source>(parent, pad, archive.size()));
    REQUIRE(c.storages.size() == direct.storages.size());
    const std::vector<bool> needed(c.storages.size(), true);
    for (int mode = 0; mode < 3; ++mode) {
      CAPTURE(mode);  // 0: copy (CPU loader), 1: mmap, 2: mmap + populate
      ckpt::load_options o;
      o.mmap = mode > 0;
      o.populate = mode == 2;
      o.threads = 2;
      const std::vector<at::Tensor> got = ckpt::detail::load_storages(c, needed, o);
      for (size_t i = 0; i < c.storages.size(); ++i) {
        const auto& s = direct.storages[i];
        REQUIRE(got[i].numel() == int64_t(s.nbytes));
        const uint8_t* want = archive.data() + *s.file_offset;
        CHECK(std::equal(want, want + s.nbytes, got[i].data_ptr<uint8_t>()));
      }
    }
  }
  std::remove(outer.c_str());
}
