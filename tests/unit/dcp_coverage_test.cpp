// ckpt::dcp::check_coverage as a pure function on hand-made chunk lists: each refusal
// (outside the bounds, overlap, gap) with its success twin, and the hostile numbers a
// decoded file can carry (negative offsets, offsets near INT64_MAX, huge shapes).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/error.h"

namespace dcp = ckpt::dcp;

namespace {

dcp::tensor_meta tensor(std::vector<int64_t> size, std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> boxes) {
  dcp::tensor_meta t;
  t.size = std::move(size);
  uint64_t at = 100;
  for (auto& [o, s] : boxes) t.chunks.push_back({o, s, at++});
  return t;
}

std::string refusal(const dcp::tensor_meta& t) {
  try {
    dcp::check_coverage("w", t);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::corrupt);
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("dcp coverage: rows, columns and grids that tile exactly pass") {
  CHECK(refusal(tensor({5, 4}, {{{0, 0}, {3, 4}}, {{3, 0}, {2, 4}}})) == "");
  CHECK(refusal(tensor({3, 6}, {{{0, 3}, {3, 3}}, {{0, 0}, {3, 3}}})) == "");
  CHECK(refusal(tensor({3, 4}, {{{0, 0}, {2, 2}}, {{0, 2}, {2, 2}}, {{2, 0}, {1, 2}}, {{2, 2}, {1, 2}}})) == "");
  CHECK(refusal(tensor({}, {{{}, {}}})) == "");
  CHECK(refusal(tensor({0, 3}, {})) == "");
  // Zero-size boxes anywhere inside the bounds, and a replica listed twice.
  CHECK(refusal(tensor({1, 3}, {{{0, 0}, {1, 3}}, {{1, 0}, {0, 3}}, {{0, 3}, {1, 0}}})) == "");
  CHECK(refusal(tensor({4}, {{{0}, {4}}, {{0}, {4}}})) == "");
}

TEST_CASE("dcp coverage: a box outside the bounds is named") {
  CHECK(refusal(tensor({3, 6}, {{{0, 0}, {3, 3}}, {{0, 3}, {3, 4}}})) ==
        "tensor 'w': chunk 1 (offsets (0, 3), sizes (3, 4)) lies outside the global shape (3, 6)");
  CHECK(refusal(tensor({1, 3}, {{{0, 0}, {1, 3}}, {{2, 0}, {0, 3}}})).find("chunk 1") != std::string::npos);
  CHECK(refusal(tensor({4}, {{{-1}, {5}}})).find("lies outside") != std::string::npos);
  // offset + size would overflow int64: still a plain refusal, no wrap-around.
  CHECK(refusal(tensor({4}, {{{INT64_MAX}, {INT64_MAX}}})).find("lies outside") != std::string::npos);
  CHECK(refusal(tensor({4}, {{{2}, {INT64_MAX}}})).find("lies outside") != std::string::npos);
}

TEST_CASE("dcp coverage: overlapping boxes are named, later one first") {
  CHECK(refusal(tensor({5, 4}, {{{0, 0}, {3, 4}}, {{2, 0}, {3, 4}}})) ==
        "tensor 'w': chunk (offsets (2, 0), sizes (3, 4)) overlaps chunk (offsets (0, 0), sizes (3, 4))");
  // Column-sharded boxes overlapping in dimension 1 only.
  CHECK(refusal(tensor({3, 6}, {{{0, 0}, {3, 4}}, {{0, 3}, {3, 3}}})).find("overlaps") != std::string::npos);
  CHECK(refusal(tensor({4}, {{{0}, {4}}, {{1}, {3}}})).find("overlaps") != std::string::npos);
}

TEST_CASE("dcp coverage: a gap is named as a box") {
  CHECK(refusal(tensor({3, 4}, {{{0, 0}, {2, 2}}, {{0, 2}, {2, 2}}, {{2, 0}, {1, 2}}})) ==
        "tensor 'w': no chunk holds the elements at offsets (2, 2), sizes (1, 2) of global shape (3, 4)");
  CHECK(refusal(tensor({}, {})) == "tensor 'w': no chunk holds the elements at offsets (), sizes () of global shape ()");
  CHECK(refusal(tensor({5}, {{{0}, {2}}, {{3}, {2}}})) ==
        "tensor 'w': no chunk holds the elements at offsets (2,), sizes (1,) of global shape (5,)");
  // A shape whose element count does not fit in int64 is refused before any arithmetic.
  CHECK(refusal(tensor({INT64_MAX, INT64_MAX}, {})).find("too large") != std::string::npos);
}

TEST_CASE("dcp coverage: a gap in a grid too large to walk is still found, by count") {
  // 2000 one-element boxes on a 2000 x 2000 grid: the cell walk is bounded, the counts are not.
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> boxes;
  for (int64_t i = 0; i < 2000; ++i) boxes.push_back({{i, i}, {1, 1}});
  std::string msg = refusal(tensor({2000, 2000}, boxes));
  CHECK(msg.find("tensor 'w': ") == 0);
  CHECK(msg.find("hold") != std::string::npos);
}

TEST_CASE("format_shape writes boxes as Python prints tuples") {
  CHECK(dcp::format_shape({}) == "()");
  CHECK(dcp::format_shape({5}) == "(5,)");
  CHECK(dcp::format_shape({3, 0}) == "(3, 0)");
  CHECK(dcp::format_shape({-1, INT64_MIN, INT64_MAX}) == "(-1, -9223372036854775808, 9223372036854775807)");
}

TEST_CASE("storage_index finds each entry by fqn and offsets, and nothing else") {
  std::vector<dcp::storage_item> entries;
  for (int64_t k = 0; k < 3000; ++k)
    for (int64_t r = 0; r < 4; ++r) {
      dcp::storage_item s;
      s.fqn = "layers." + std::to_string(k) + ".w";
      s.offsets = std::vector<int64_t>{4 * r, 0};
      entries.push_back(s);
    }
  dcp::storage_item bytes;  // a BYTE_IO item beside a chunk at () of the same name
  bytes.fqn = "scalar";
  entries.push_back(bytes);
  dcp::storage_item scalar_chunk;
  scalar_chunk.fqn = "scalar";
  scalar_chunk.offsets = std::vector<int64_t>{};
  entries.push_back(scalar_chunk);

  const dcp::storage_index index(entries);
  for (const auto& s : entries) CHECK(index.find(s.fqn, s.offsets ? &*s.offsets : nullptr) == &s);
  const ckpt::dim_list elsewhere{2, 0}, wrong_rank{0};
  CHECK(index.find("layers.7.w", &elsewhere) == nullptr);
  CHECK(index.find("layers.7.w", &wrong_rank) == nullptr);
  CHECK(index.find("layers.7.w", nullptr) == nullptr);
  CHECK(index.find("layers.3000.w", &entries[0].offsets.value()) == nullptr);
  CHECK(dcp::storage_index().find("scalar", nullptr) == nullptr);

  entries.push_back(entries[5]);
  entries.back().at = 77;
  try {
    dcp::storage_index twice(entries);
    FAIL("an entry listed twice was accepted");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::corrupt);
    CHECK(e.message() == "storage_data lists 'layers.1.w' at offsets (4, 0) twice");
    CHECK(e.offset() == std::optional<uint64_t>(77));
  }
}
