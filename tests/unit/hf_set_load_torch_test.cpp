// load_tensors over a Hugging Face shard set on disk: every loader path (the CPU loader's
// copy, mmap, mmap + populate) reads each storage from its own shard, in the order the
// loaders give the keys. The shards here are torch.save zips from ckptool's own writer;
// sets from the real writers are tests/py/test_hf_sets.py's.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "torch_doctest.h"

#include "ckpt/checkpoint.h"
#include "ckpt/load.h"

TEST_CASE("load_tensors reads a shard set, each storage from its shard") {
  // No std::filesystem here: libtorch.so exports its own copy, which this binary would bind.
  char dir_template[] = "/tmp/ckpt_hf_set_XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string dir = dir_template;
  // 4 MiB tensors, large enough for pages of their own, and small ones after them.
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>> shards{
      {"pytorch_model-00001-of-00003.bin",
       {{"a.weight", at::arange(int64_t(1) << 20, at::kFloat)}, {"a.bias", at::full({7}, 1.5, at::kDouble)}}},
      {"pytorch_model-00002-of-00003.bin", {{"b.weight", at::arange(int64_t(3) << 18, at::kInt)}}},
      {"pytorch_model-00003-of-00003.bin",
       {{"c.weight", at::full({1000, 3}, -2.0, at::kFloat)}, {"c.index", at::arange(5, at::kLong)}}}};
  std::string map;
  for (const auto& [file, tensors] : shards) {
    ckpt::save_tensors(tensors, dir + "/" + file);
    for (const auto& kt : tensors) map += (map.empty() ? "\"" : ", \"") + kt.first + "\": \"" + file + "\"";
  }
  const std::string index = dir + "/pytorch_model.bin.index.json";
  std::ofstream(index) << "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" << map << "}}";

  const ckpt::checkpoint c = ckpt::open_checkpoint(dir);
  REQUIRE(c.files.size() == 3);
  CHECK(c.warnings.size() == 1);  // total_size 0
  for (int mode = 0; mode < 3; ++mode) {
    CAPTURE(mode);  // 0: copy (CPU loader), 1: mmap, 2: mmap + populate
    ckpt::load_options o;
    o.mmap = mode > 0;
    o.populate = mode == 2;
    o.threads = 2;
    const auto got = ckpt::load_tensors(c, o);
    size_t i = 0;
    for (const auto& [file, tensors] : shards)
      for (const auto& [key, want] : tensors) {
        REQUIRE(i < got.size());
        CHECK(got[i].first == key);
        CHECK(got[i].second.dtype() == want.dtype());
        CHECK(got[i].second.equal(want));
        ++i;
      }
    CHECK(i == got.size());
  }
  // The path API opens the set by its index as well.
  CHECK(ckpt::load_tensors(index, {}).size() == 5);
  for (const auto& shard : shards) std::remove((dir + "/" + shard.first).c_str());
  std::remove(index.c_str());
  ::rmdir(dir.c_str());
}
