// ckpt::dcp::merge_rank_local on hand-made rank files (docs/formats.md §9.8): the union a
// use_collectives=False save makes whole, each refusal naming the file it is about, with
// its success twin. The real writer's files are tests/py/test_dcp_rank_local.py's.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/error.h"

namespace dcp = ckpt::dcp;

namespace {

// Rank r of `ranks` holding rows [r * rows, (r + 1) * rows) of "w" (float32, ranks * rows
// by 2), a replicated "b" (4,), and the BYTE_IO item "step".
dcp::metadata rank_file(uint32_t r, int64_t rows, int64_t ranks) {
  dcp::metadata md;
  const std::string file = "__" + std::to_string(r) + "_0.distcp";
  dcp::item w;
  w.fqn = "w";
  w.is_tensor = true;
  w.tensor.size = {rows * ranks, 2};
  w.tensor.chunks.push_back({{int64_t(r) * rows, 0}, {rows, 2}, 10});
  dcp::item b;
  b.fqn = "b";
  b.is_tensor = true;
  b.tensor.size = {4};
  b.tensor.chunks.push_back({{0}, {4}, 20});
  dcp::item step;
  step.fqn = "step";
  md.items = {w, b, step};
  md.storage_data.push_back({"w", std::vector<int64_t>{int64_t(r) * rows, 0}, 0, file, 0, 100, {}, 30});
  md.storage_data.push_back({"b", std::vector<int64_t>{0}, 0, file, 100, 100, {}, 40});
  md.storage_data.push_back({"step", std::nullopt, std::nullopt, file, 200, 50, {}, 50});
  return md;
}

std::vector<std::string> names(size_t n) {
  std::vector<std::string> out;
  for (size_t r = 0; r < n; ++r) out.push_back("ckpt/__" + std::to_string(r) + ".metadata");
  return out;
}

ckpt::error refusal(std::vector<dcp::metadata> ranks) {
  const size_t n = ranks.size();
  try {
    dcp::merge_rank_local(std::move(ranks), names(n));
  } catch (const ckpt::error& e) {
    return e;
  }
  return ckpt::error(ckpt::errc::usage, "no refusal");
}

}  // namespace

TEST_CASE("dcp rank-local: file names") {
  CHECK(dcp::rank_local_metadata_rank("__0.metadata") == 0u);
  CHECK(dcp::rank_local_metadata_rank("__17.metadata") == 17u);
  CHECK_FALSE(dcp::rank_local_metadata_rank(".metadata"));
  CHECK_FALSE(dcp::rank_local_metadata_rank("__.metadata"));
  CHECK_FALSE(dcp::rank_local_metadata_rank("__01.metadata"));
  CHECK_FALSE(dcp::rank_local_metadata_rank("__-1.metadata"));
  CHECK_FALSE(dcp::rank_local_metadata_rank("__1.metadata.tmp"));
  CHECK_FALSE(dcp::rank_local_metadata_rank("__99999999999.metadata"));
}

TEST_CASE("dcp rank-local: the union, replicas kept once and listed") {
  dcp::metadata md = dcp::merge_rank_local({rank_file(0, 3, 2), rank_file(1, 3, 2)}, names(2));
  REQUIRE(md.items.size() == 3);
  CHECK(md.items[0].tensor.chunks.size() == 2);
  CHECK(md.items[0].tensor.chunks[1].source == 1);
  CHECK(md.storage_data.size() == 4);  // w twice (two boxes), b and step once
  REQUIRE(md.replicas.size() == 2);    // rank 1's b and step
  CHECK(md.replicas[0].fqn == "b");
  CHECK(md.replicas[0].relative_path == "__1_0.distcp");
  CHECK(md.sources == names(2));
}

TEST_CASE("dcp rank-local: files that disagree are refused, naming the later file") {
  dcp::metadata other = rank_file(1, 3, 2);
  other.items[1].tensor.type = ckpt::dtype::float16;
  ckpt::error e = refusal({rank_file(0, 3, 2), other});
  CHECK(e.kind() == ckpt::errc::corrupt);
  CHECK(e.file() == "ckpt/__1.metadata");
  CHECK(e.message().find("tensor 'b'") != std::string::npos);

  other = rank_file(1, 3, 2);
  other.items[2].is_tensor = true;
  other.items[2].tensor.size = {};
  other.items[2].tensor.chunks.push_back({{}, {}, 60});
  other.storage_data[2].offsets = std::vector<int64_t>{};
  e = refusal({rank_file(0, 3, 2), other});
  CHECK(e.file() == "ckpt/__1.metadata");
  CHECK(e.message().find("'step' is a tensor here") != std::string::npos);

  other = rank_file(1, 3, 2);
  other.storage_data[0].relative_path = "__0_0.distcp";
  e = refusal({rank_file(0, 3, 2), other});
  CHECK(e.file() == "ckpt/__1.metadata");
  CHECK(e.message().find("this rank's own __1_") != std::string::npos);

  other = rank_file(1, 3, 2);
  other.storage_data.pop_back();  // its own "step" has no entry of its own file
  e = refusal({rank_file(0, 3, 2), other});
  CHECK(e.file() == "ckpt/__1.metadata");
  CHECK(e.message().find("'step'") != std::string::npos);
}

TEST_CASE("dcp rank-local: coverage over all ranks, errors naming the box's file") {
  // Rank 1's box overlaps rank 0's: named in rank 1's file.
  dcp::metadata over = rank_file(1, 3, 2);
  over.items[0].tensor.chunks[0].offsets = {2, 0};
  over.storage_data[0].offsets = std::vector<int64_t>{2, 0};
  ckpt::error e = refusal({rank_file(0, 3, 2), over});
  CHECK(e.file() == "ckpt/__1.metadata");
  CHECK(e.message().find("overlaps chunk (offsets (0, 0), sizes (3, 2)) of ckpt/__0.metadata") != std::string::npos);
  // One rank alone does not cover "w": that is the gap of a lost rank.
  e = refusal({rank_file(0, 3, 2)});
  CHECK(e.kind() == ckpt::errc::corrupt);
  CHECK(e.message().find("no chunk holds the elements at offsets (3, 0)") != std::string::npos);
}
