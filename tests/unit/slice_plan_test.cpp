// Tensor-parallel slices without LibTorch: placements and plans (ckpt/slice.h), torch.chunk's
// split, the intersection of a slice with a tensor's pieces (model/slice_plan.h) including
// empty shards and 0-dim tensors, and the reads planned from it. A brute-force check lands
// random slices of random piece grids from a simulated file and compares every element.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <limits>
#include <vector>

#include "base/glob.h"
#include "ckpt/error.h"
#include "ckpt/slice.h"
#include "model/slice_plan.h"

using ckpt::dim_range;
using ckpt::placement;
using ckpt::detail::slice_span;
using ckpt::detail::slice_read;

namespace {

using box = std::vector<dim_range>;
using spans = std::vector<slice_span>;

spans meet(const box& slice, const box& piece, uint64_t e, uint64_t offset) {
  spans out;
  ckpt::detail::intersect_piece(slice, piece, e, offset, out);
  return out;
}

ckpt::errc kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ckpt::error& e) {
    return e.kind();
  }
  return ckpt::errc::check_failed;  // "nothing thrown", never expected below
}

}  // namespace

TEST_CASE("chunk_range splits as torch.chunk and DTensor's Shard do, empty ranks included") {
  const std::vector<dim_range> ten{{0, 3}, {3, 3}, {6, 3}, {9, 1}};
  for (int r = 0; r < 4; ++r) CHECK(ckpt::chunk_range(10, r, 4) == ten[r]);
  // chunk(5, 4) makes 3 chunks of 2, 2, 1: the fourth rank's shard is empty, at the end.
  const std::vector<dim_range> five{{0, 2}, {2, 2}, {4, 1}, {5, 0}};
  for (int r = 0; r < 4; ++r) CHECK(ckpt::chunk_range(5, r, 4) == five[r]);
  const std::vector<dim_range> two{{0, 1}, {1, 1}, {2, 0}, {2, 0}};
  for (int r = 0; r < 4; ++r) CHECK(ckpt::chunk_range(2, r, 4) == two[r]);
  CHECK(ckpt::chunk_range(0, 2, 3) == dim_range{0, 0});
  CHECK(ckpt::chunk_range(7, 0, 1) == dim_range{0, 7});
  // A world near 2^63: size + world - 1 and full * rank would overflow int64.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  CHECK(ckpt::chunk_range(5, 0, huge) == dim_range{0, 1});
  CHECK(ckpt::chunk_range(5, 4, huge) == dim_range{4, 1});
  CHECK(ckpt::chunk_range(5, huge - 1, huge) == dim_range{5, 0});
  CHECK(ckpt::chunk_range(huge, 1, 2) == dim_range{huge / 2 + 1, huge / 2});
}

TEST_CASE("placements parse in DTensor's spelling and print back") {
  CHECK(ckpt::parse_placement("Replicate()").type == placement::kind::replicate);
  CHECK(ckpt::parse_placement("Replicate").type == placement::kind::replicate);
  placement p = ckpt::parse_placement(" Shard ( dim = -1 ) ");
  CHECK(p.type == placement::kind::shard);
  CHECK(p.dim == -1);
  CHECK(ckpt::placement_text(ckpt::parse_placement("Shard(1)")) == "Shard(1)");
  p = ckpt::parse_placement("Range(dim=1, start=2, length=3)");
  CHECK(ckpt::placement_text(p) == "Range(1, 2, 3)");
  // Every int64 is read, to the last one (a conservative bound refused 2^63 - 2).
  p = ckpt::parse_placement("Range(0, 9223372036854775806, 9223372036854775807)");
  CHECK(p.start == std::numeric_limits<int64_t>::max() - 1);
  CHECK(p.length == std::numeric_limits<int64_t>::max());
  for (const char* bad : {"Shard", "Shard()", "Shard(x)", "Shard(1,2)", "Partial()", "Range(0,1)", "Range(0,-1,2)",
                          "Shard(start=1)", "Shard(99999999999999999999)", ""})
    CHECK_MESSAGE(kind_of([&] { ckpt::parse_placement(bad); }) == ckpt::errc::usage, bad);
}

TEST_CASE("slice_box: a dimension the tensor lacks, a 0-dim tensor, a range outside") {
  const placement s0{placement::kind::shard, 0}, last{placement::kind::shard, -1};
  CHECK(ckpt::slice_box(last, {4, 6}, 1, 2, "k") == box{{0, 4}, {3, 3}});
  CHECK(ckpt::slice_box(placement{}, {}, 0, 2, "k").empty());
  CHECK(kind_of([&] { ckpt::slice_box(s0, {}, 0, 2, "k"); }) == ckpt::errc::usage);
  CHECK(kind_of([&] { ckpt::slice_box(placement{placement::kind::shard, 2}, {4, 6}, 0, 2, "k"); }) == ckpt::errc::usage);
  CHECK(kind_of([&] { ckpt::slice_box(placement{placement::kind::range, 1, 4, 3}, {4, 6}, 0, 1, "k"); }) ==
        ckpt::errc::usage);
  CHECK(ckpt::slice_box(placement{placement::kind::range, 1, 4, 2}, {4, 6}, 0, 1, "k") == box{{0, 4}, {4, 2}});
}

TEST_CASE("plans: first match wins, order as written, duplicates and bad values refused, the llama-tp preset") {
  ckpt::slice_selection s = ckpt::parse_slice_plan(
      R"J({"*o_proj.weight": "Shard(1)", "*.weight": "Shard(0)", "*": "Replicate()"})J", "plan", 1, 2);
  CHECK(s.match("layers.0.self_attn.o_proj.weight")->dim == 1);
  CHECK(s.match("layers.0.self_attn.q_proj.weight")->dim == 0);
  CHECK(s.match("norm.bias")->type == placement::kind::replicate);
  ckpt::slice_selection only = ckpt::parse_slice_plan(R"J({"*.weight": "Shard(0)"})J", "plan", 0, 1);
  CHECK(!only.match("norm.bias"));
  CHECK(kind_of([] { ckpt::parse_slice_plan(R"J({"a": "Shard(0)", "a": "Replicate"})J", "p", 0, 1); }) ==
        ckpt::errc::usage);
  CHECK(kind_of([] { ckpt::parse_slice_plan(R"J({"a": 0})J", "p", 0, 1); }) == ckpt::errc::usage);
  CHECK(kind_of([] { ckpt::parse_slice_plan(R"J(["a"])J", "p", 0, 1); }) == ckpt::errc::usage);
  CHECK(kind_of([] { ckpt::parse_slice_plan(R"J({"a": "Shard(0)"})J", "p", 2, 2); }) == ckpt::errc::usage);
  CHECK(kind_of([] { ckpt::parse_slice_plan("{", "p", 0, 1); }) == ckpt::errc::usage);
  auto llama = ckpt::slice_preset("llama-tp", 0, 4);
  REQUIRE(llama);
  CHECK(llama->match("model.layers.3.mlp.down_proj.weight")->dim == 1);
  CHECK(llama->match("model.layers.3.mlp.gate_proj.weight")->dim == 0);
  CHECK(llama->match("model.embed_tokens.weight")->dim == 0);
  CHECK(llama->match("model.layers.3.input_layernorm.weight")->type == placement::kind::replicate);
  CHECK(!ckpt::slice_preset("gpt-tp", 0, 4));
}

TEST_CASE("a row slice of a tensor held whole is one run; a column slice is one run per row") {
  // [4, 6] float32 at file offset 1000.
  const box whole{{0, 4}, {0, 6}};
  CHECK(meet({{2, 2}, {0, 6}}, whole, 4, 1000) == spans{{1048, 0, 48, 1, 0, 0}});
  CHECK(meet({{0, 4}, {2, 2}}, whole, 4, 1000) == spans{{1008, 0, 8, 4, 24, 8}});
  CHECK(meet(whole, whole, 4, 1000) == spans{{1000, 0, 96, 1, 0, 0}});
}

TEST_CASE("a slice meets DCP chunks: row chunks, column chunks, chunks it misses") {
  // [4, 6] float32 saved as two row chunks at 0 and 500.
  const box top{{0, 2}, {0, 6}}, bottom{{2, 2}, {0, 6}};
  const box left_cols{{0, 4}, {0, 3}};
  CHECK(meet(left_cols, top, 4, 0) == spans{{0, 0, 12, 2, 24, 12}});
  CHECK(meet(left_cols, bottom, 4, 500) == spans{{500, 24, 12, 2, 24, 12}});
  // Saved as two column chunks [4, 3] at 0 and 100; rows 2..3 of the whole tensor.
  const box rows{{2, 2}, {0, 6}};
  CHECK(meet(rows, {{0, 4}, {0, 3}}, 4, 0) == spans{{24, 0, 12, 2, 12, 24}});
  CHECK(meet(rows, {{0, 4}, {3, 3}}, 4, 100) == spans{{124, 12, 12, 2, 12, 24}});
  CHECK(meet({{0, 2}, {0, 6}}, bottom, 4, 500).empty());
}

TEST_CASE("empty shards, 0-dim tensors, size-1 dimensions and three dimensions") {
  CHECK(meet({{2, 0}, {0, 6}}, {{0, 2}, {0, 6}}, 4, 0).empty());  // rank past the last chunk
  CHECK(meet({}, {}, 8, 64) == spans{{64, 0, 8, 1, 0, 0}});        // a 0-dim tensor, replicated
  // [1, 6]: a column slice of a single row is one run.
  CHECK(meet({{0, 1}, {3, 3}}, {{0, 1}, {0, 6}}, 2, 0) == spans{{6, 0, 6, 1, 0, 0}});
  // [2, 3, 4] Shard(2) of 2, rank 1: per outer index one span of 3 rows.
  CHECK(meet({{0, 2}, {0, 3}, {2, 2}}, {{0, 2}, {0, 3}, {0, 4}}, 4, 0) ==
        spans{{8, 0, 8, 3, 16, 8}, {56, 24, 8, 3, 16, 8}});
}

TEST_CASE("reads: straight runs cut at max_read, far rows one by one, close rows through a buffer") {
  ckpt::detail::slice_read_options o;
  o.max_read = 16;
  auto reads = ckpt::detail::plan_slice_reads({{100, 0, 40, 1, 0, 0}}, o);
  REQUIRE(reads.size() == 3);
  CHECK(reads[2].offset == 132);
  CHECK(reads[2].nbytes == 8);
  CHECK(reads[2].how == slice_read::mode::direct);
  // Width 8 every 24 bytes: far apart, each row read alone (the bytes read are the slice's).
  reads = ckpt::detail::plan_slice_reads({{0, 0, 8, 4, 24, 8}});
  REQUIRE(reads.size() == 1);
  CHECK(reads[0].how == slice_read::mode::rows);
  CHECK(reads[0].nbytes == 32);
  // Width 4096 every 4160 bytes: one read with the 64-byte gaps (under 1/32 more bytes).
  reads = ckpt::detail::plan_slice_reads({{0, 0, 4096, 10, 4160, 4096}});
  REQUIRE(reads.size() == 1);
  CHECK(reads[0].how == slice_read::mode::bounce);
  CHECK(reads[0].nbytes == 9 * 4160 + 4096);
  // No read past max_read, whatever the mode.
  o.max_read = 3 * 4160;
  reads = ckpt::detail::plan_slice_reads({{0, 0, 4096, 10, 4160, 4096}}, o);
  CHECK(reads.size() == 4);
  for (const auto& r : reads) CHECK(r.nbytes <= o.max_read);
}

TEST_CASE("random slices of random chunk grids land every element where it belongs") {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t rank = rng() % 4;  // 0-dim included
    std::vector<int64_t> shape(rank);
    for (auto& n : shape) n = int64_t(rng() % 6);
    // Each dimension cut in up to 3 chunks: the pieces are the grid's cells.
    std::vector<std::vector<dim_range>> cuts(rank);
    for (size_t d = 0; d < rank; ++d) {
      int64_t at = 0;
      while (at < shape[d]) {
        const int64_t len = std::min<int64_t>(shape[d] - at, 1 + int64_t(rng() % 3));
        cuts[d].push_back({at, len});
        at += len;
      }
      if (cuts[d].empty()) cuts[d].push_back({0, 0});
    }
    std::vector<box> pieces(1);
    for (size_t d = 0; d < rank; ++d) {
      std::vector<box> next;
      for (const box& b : pieces)
        for (const dim_range& r : cuts[d]) {
          next.push_back(b);
          next.back().push_back(r);
        }
      pieces = next;
    }
    // The simulated file: each piece's elements row-major, each element its global index.
    std::vector<uint32_t> file;
    std::vector<uint64_t> offsets;
    for (const box& p : pieces) {
      offsets.push_back(file.size() * 4);
      std::vector<int64_t> idx(rank);
      uint64_t n = 1;
      for (const auto& r : p) n *= uint64_t(r.length);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t rest = i, global = 0, pitch = 1;
        for (size_t d = rank; d-- > 0;) {
          idx[d] = p[d].start + int64_t(rest % uint64_t(p[d].length));
          rest /= uint64_t(p[d].length);
        }
        for (size_t d = rank; d-- > 0;) {
          global += uint64_t(idx[d]) * pitch;
          pitch *= uint64_t(shape[d]);
        }
        file.push_back(uint32_t(global));
      }
    }
    const placement p = rank && rng() % 4 ? placement{placement::kind::shard, int64_t(rng() % rank)} : placement{};
    const int64_t world = 1 + int64_t(rng() % 4), r = int64_t(rng() % uint64_t(world));
    const box slice = ckpt::slice_box(p, shape, r, world, "t");
    uint64_t numel = 1;
    for (const auto& d : slice) numel *= uint64_t(d.length);
    std::vector<uint32_t> got(numel, 0xffffffffu);
    spans all;
    for (size_t k = 0; k < pieces.size(); ++k) ckpt::detail::intersect_piece(slice, pieces[k], 4, offsets[k], all);
    CHECK(ckpt::detail::span_bytes(all) == numel * 4);
    ckpt::detail::slice_read_options o;
    o.max_read = 8 + rng() % 40;
    o.gap_ratio = 1 + rng() % 2;
    const auto* src = reinterpret_cast<const uint8_t*>(file.data());
    auto* dst = reinterpret_cast<uint8_t*>(got.data());
    for (const slice_read& rd : ckpt::detail::plan_slice_reads(all, o)) {
      const slice_span& s = all[rd.span];
      CHECK(rd.nbytes <= std::max<uint64_t>(o.max_read, s.width));
      if (rd.how == slice_read::mode::direct)
        std::memcpy(dst + s.dst + (rd.offset - s.src), src + rd.offset, rd.nbytes);
      else
        for (uint64_t k = rd.first_row; k < rd.first_row + rd.row_count; ++k)
          std::memcpy(dst + s.dst + k * s.dst_pitch, src + s.src + k * s.src_pitch, s.width);
    }
    // Expected: the slice's elements, row-major, by their global index.
    for (uint64_t i = 0; i < numel; ++i) {
      uint64_t rest = i, global = 0, pitch = 1;
      for (size_t d = rank; d-- > 0;) {
        const int64_t at = slice[d].start + int64_t(rest % uint64_t(slice[d].length));
        rest /= uint64_t(slice[d].length);
        global += uint64_t(at) * pitch;
        pitch *= uint64_t(shape[d]);
      }
      if (got[i] != uint32_t(global)) {
        FAIL_CHECK("trial " << trial << " element " << i);
        break;
      }
    }
  }
}

TEST_CASE("read_spans lands a box from a byte source: far rows, close rows through the buffer, cut reads") {
  // A [2, 3, 40] uint32 tensor, each element its index, 16 bytes into the source.
  const std::vector<int64_t> shape = {2, 3, 40};
  std::vector<uint8_t> bytes(16 + 240 * 4);
  for (uint32_t i = 0; i < 240; ++i) std::memcpy(bytes.data() + 16 + i * 4, &i, 4);
  const ckpt::memory_source file(bytes, "t.bin");
  const box whole = {{0, 2}, {0, 3}, {0, 40}};
  for (const box& b : {box{{0, 2}, {1, 2}, {0, 40}}, box{{0, 2}, {0, 3}, {10, 20}}, box{{1, 1}, {0, 3}, {0, 39}},
                       box{{0, 2}, {2, 1}, {5, 1}}}) {
    for (uint64_t max_read : {uint64_t(16) << 20, uint64_t(200)}) {
      const spans sp = meet(b, whole, 4, 16);
      std::vector<uint32_t> got(size_t(b[0].length * b[1].length * b[2].length), 0xffffffffu);
      ckpt::detail::slice_read_options o;
      o.max_read = max_read;
      const uint64_t read = ckpt::detail::read_spans(file, sp, reinterpret_cast<uint8_t*>(got.data()), o);
      CHECK(read >= got.size() * 4);
      size_t k = 0;
      for (int64_t i = b[0].start; i < b[0].start + b[0].length; ++i)
        for (int64_t j = b[1].start; j < b[1].start + b[1].length; ++j)
          for (int64_t l = b[2].start; l < b[2].start + b[2].length; ++l)
            CHECK(got[k++] == uint32_t((i * shape[1] + j) * shape[2] + l));
    }
  }
  // A source that ends early: the error names the file.
  const ckpt::memory_source short_file(std::vector<uint8_t>(100), "short.bin");
  std::vector<uint32_t> got(240);
  CHECK_THROWS_WITH(ckpt::detail::read_spans(short_file, meet(whole, whole, 4, 16), reinterpret_cast<uint8_t*>(got.data())),
                    doctest::Contains("short.bin"));
}

TEST_CASE("glob_match is Python's fnmatch.fnmatchcase") {
  using ckpt::text::glob_match;
  struct row {
    const char* pattern;
    std::string key;
    bool match;
  };
  // Each verdict is fnmatch.fnmatchcase's (Python 3.11).
  const row rows[] = {
      {"*.weight", "layers.0.weight", true},   {"*.weight", "layers.0.bias", false},
      {"a?c", "abc", true},                   {"a?c", "ac", false},
      {"a*", std::string("a\0b", 3), true},    {"a", std::string("a\0b", 3), false},
      {"[a-c]x", "bx", true},                 {"[a-c]x", "dx", false},
      {"[!a]", "b", true},                    {"[!a]", "a", false},
      {"[]]", "]", true},                     {"[!]]", "]", false},
      {"[", "[", true},                       {"[a", "[a", true},
      {"a[!]", "a[!]", true},                 {"[z-a]b", "zb", false},
      {"[!z-a]", "q", true},                  {"a\\*", "a\\xyz", true},
      {"a\\*", "a*", false},                  {"[a-]", "-", true},
      {"[-a]", "-", true},                    {"[a-c-e]", "-", true},
      {"[a-c-e]", "d", false},                {"[a-c-e]", "e", true},
      {"*", "", true},                        {"**a**", "xxaxx", true},
      {"?", "é", true},                       {"[é]", "é", true},
      {"x*y*z", "xaaybbz", true},             {"x*y*z", "xaaybb", false},
  };
  for (const row& r : rows) {
    CAPTURE(r.pattern);
    CAPTURE(r.key);
    CHECK(glob_match(r.pattern, r.key) == r.match);
  }
  CHECK_FALSE(glob_match(std::string_view("v\0x", 3), "v"));
}
