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
#include "ckpt/load_slices.h"
#include "ckpt/slice.h"
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

TEST_CASE("a rank opens the DCP chunks its slice meets; a slice meeting one not opened is refused") {
  const std::string dir = std::string(CKPT_SOURCE_DIR) + "/tests/data/dcp/small";
  // w: float32 arange(20).reshape(5, 4) in two boxes, rows 0-2 and 3-4 (tests/data/dcp/make.py).
  const ckpt::slice_selection sel = ckpt::parse_slice_plan(R"J({"w": "Shard(0)"})J", "plan", 1, 2);
  ckpt::open_options o;
  o.open_chunk = ckpt::chunks_met_by(sel);
  const ckpt::checkpoint c = ckpt::open_checkpoint(dir, o);
  ckpt::slice_load_report r;
  const auto got = ckpt::load_tensors(c, ckpt::load_options(), sel, &r);
  REQUIRE(got.size() == 1);
  CHECK(got[0].first == "w");
  CHECK(at::equal(got[0].second, at::arange(12, 20, at::kFloat).reshape({2, 4})));
  CHECK(r.bytes_read == 2 * 4 * 4);

  // Rank 0's slice (rows 0-2) meets the box rank 1 did not open.
  const ckpt::slice_selection rank0 = ckpt::parse_slice_plan(R"J({"w": "Shard(0)"})J", "plan", 0, 2);
  try {
    ckpt::load_tensors(c, ckpt::load_options(), rank0);
    FAIL("a slice of a chunk not opened was read");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::unsupported);
    CHECK(std::string(e.what()).find("its archive was not opened") != std::string::npos);
  }
}
