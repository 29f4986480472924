// The DCP reader (model/open_dcp.cpp) on a real two-rank directory held in a memory_opener
// (tests/data/dcp/make.py wrote it with dcp.save): what it reads, where each chunk's data
// lies, and a table of broken directories, each beside the intact one it was made from.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "ckpt/slice.h"
#include "model/read_plan.h"

namespace {

std::vector<uint8_t> fixture(const std::string& name) {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/tests/data/dcp/" + name, std::ios::binary);
  REQUIRE(in.good());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

struct dir_files {
  std::vector<uint8_t> metadata = fixture("twin.metadata");
  std::vector<uint8_t> rank0 = fixture("small/__0_0.distcp");
  std::vector<uint8_t> rank1 = fixture("small/__1_0.distcp");

  ckpt::memory_opener opener() const {
    ckpt::memory_opener m("mem");
    m.add("run/.metadata", metadata);
    m.add("run/__0_0.distcp", rank0);
    m.add("run/__1_0.distcp", rank1);
    return m;
  }
};

ckpt::checkpoint open(const dir_files& d, bool chunks = true) {
  ckpt::open_options o;
  o.read_chunk_archives = chunks;
  return ckpt::open_checkpoint("run", o, d.opener());
}

// The refusal of a broken directory: its kind and its one line.
std::pair<ckpt::errc, std::string> refusal(const dir_files& d) {
  try {
    open(d);
  } catch (const ckpt::error& e) {
    return {e.kind(), e.one_line()};
  }
  return {ckpt::errc::check_failed, ""};
}

size_t key_index(const ckpt::checkpoint& c, const std::string& key) {
  for (size_t k = 0; k < c.keys.size(); ++k)
    if (c.keys.key(k) == key) return k;
  FAIL("no key " << key);
  return 0;
}

template <class T>
std::vector<T> data_of(const ckpt::checkpoint& c, size_t tensor) {
  const ckpt::storage_record& s = c.storages[*c.tensors[tensor].storage];
  std::vector<uint8_t> raw = c.files[s.file].source->read_vector(*s.file_offset, size_t(s.nbytes));
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
  return v;
}

// Where storage_data puts the last item of a file (its end is the file's end).
ckpt::dcp::storage_item last_item(const dir_files& d, const std::string& file) {
  const ckpt::dcp::metadata md = ckpt::dcp::decode_metadata(d.metadata.data(), d.metadata.size());
  ckpt::dcp::storage_item last;
  for (const auto& s : md.storage_data)
    if (s.relative_path == file && s.offset >= last.offset) last = s;
  return last;
}

}  // namespace

TEST_CASE("dcp reader: keys, pieces and the bytes each chunk's storage points at") {
  const dir_files d;
  const ckpt::checkpoint c = open(d);
  CHECK(c.layout == ckpt::checkpoint_layout::dcp);
  CHECK(c.index_path == "mem/run/.metadata");
  CHECK(c.writer == "1.0.0");
  REQUIRE(c.keys.size() == 2);

  const size_t w = key_index(c, "w");
  CHECK(c.keys.type(w, c.tensors) == ckpt::dtype::float32);
  CHECK(std::vector<int64_t>(c.keys.shape(w, c.tensors).begin(), c.keys.shape(w, c.tensors).end()) ==
        std::vector<int64_t>{5, 4});
  REQUIRE(c.keys.piece_count(w) == 2);
  for (size_t p = 0; p < 2; ++p) {
    const ckpt::tensor_piece piece = c.keys.piece(w, p);
    // arange(20).reshape(5, 4): the box starting at row r holds r*4, r*4+1, ...
    const std::vector<float> got = data_of<float>(c, piece.tensor);
    REQUIRE(!got.empty());
    CHECK(got.front() == float(piece.offsets[0] * 4));
    CHECK(got.size() == size_t(c.tensors[piece.tensor].shape[0] * 4));
    CHECK(got.back() == float(piece.offsets[0] * 4 + got.size() - 1));
    // The data lies in the .distcp file itself, not in a copy.
    const ckpt::storage_record& s = c.storages[*c.tensors[piece.tensor].storage];
    CHECK_FALSE(c.files[s.file].within.has_value());
    CHECK_FALSE(s.archive_range);
  }

  const size_t b = key_index(c, "b");
  REQUIRE(c.keys.piece_count(b) == 1);
  CHECK(c.keys.piece(b, 0).offsets.empty());  // a plain one-piece key
  CHECK(data_of<int64_t>(c, c.keys.tensor(b)) == std::vector<int64_t>{1, 2, 3});

  REQUIRE(c.entries.size() == 1);
  CHECK(c.entries[0].type == "int");
  CHECK(c.entries[0].value == "7");
  CHECK(c.unsafe_globals.empty());
  // Two .distcp files, and the four archives inside them (3 chunks, 1 value).
  size_t own = 0;
  for (const auto& f : c.files) own += !f.within;
  CHECK(own == 2);
  CHECK(c.files.size() == 6);
  CHECK(c.file_size() == d.rank0.size() + d.rank1.size());
}

TEST_CASE("dcp reader: the writer's own .metadata reads as its re-pickled twin does") {
  dir_files d;
  const ckpt::checkpoint twin = open(d);
  d.metadata = fixture("small/.metadata");  // as dcp.save wrote it (storage_meta included)
  const ckpt::checkpoint own = open(d);
  REQUIRE(own.keys.size() == twin.keys.size());
  for (size_t k = 0; k < own.keys.size(); ++k) {
    CHECK(own.keys.key(k) == twin.keys.key(k));
    CHECK(own.keys.piece_count(k) == twin.keys.piece_count(k));
  }
  REQUIRE(own.storages.size() == twin.storages.size());
  for (size_t i = 0; i < own.storages.size(); ++i) {
    CHECK(own.storages[i].file_offset == twin.storages[i].file_offset);
    CHECK(own.storages[i].nbytes == twin.storages[i].nbytes);
  }
}

TEST_CASE("dcp reader: from metadata alone, storages are archive ranges never read as data") {
  const dir_files d;
  const ckpt::checkpoint c = open(d, false);
  REQUIRE(c.keys.size() == 2);
  for (const auto& s : c.storages) CHECK(s.archive_range);
  // Only .metadata and the value item (its zip directory is read twice, no chunk at all).
  const ckpt::dcp::metadata md = ckpt::dcp::decode_metadata(d.metadata.data(), d.metadata.size());
  uint64_t value_bytes = 0;
  for (const auto& s : md.storage_data)
    if (!s.offsets) value_bytes += s.length;
  REQUIRE(value_bytes > 0);
  CHECK(c.bytes_read() <= d.metadata.size() + 2 * value_bytes);
  std::vector<bool> all(c.storages.size(), true);
  CHECK_THROWS_AS(ckpt::detail::plan_reads(c, all, {}), ckpt::error);
}

TEST_CASE("dcp reader: open_chunk opens only the chunks it accepts") {
  const dir_files d;
  ckpt::open_options o;
  // Rank 1 of 2 of Shard(0) meets w's second box (rows 3-4) only, and no rule matches b.
  const ckpt::slice_selection sel = ckpt::parse_slice_plan(R"J({"w": "Shard(0)"})J", "plan", 1, 2);
  std::vector<std::string> asked;
  o.open_chunk = [&](const std::string& key, const ckpt::dim_list& shape, const ckpt::dim_list& offsets,
                     const ckpt::dim_list& sizes) {
    asked.push_back(key + "@" + std::to_string(offsets.empty() ? -1 : offsets[0]));
    return ckpt::chunks_met_by(sel)(key, shape, offsets, sizes);
  };
  const ckpt::checkpoint c = ckpt::open_checkpoint("run", o, d.opener());
  std::sort(asked.begin(), asked.end());
  CHECK(asked == std::vector<std::string>{"b@0", "w@0", "w@3"});  // each chunk once
  const size_t w = key_index(c, "w");
  REQUIRE(c.keys.piece_count(w) == 2);
  for (size_t p = 0; p < 2; ++p) {
    const ckpt::tensor_piece piece = c.keys.piece(w, p);
    const ckpt::storage_record& s = c.storages[*c.tensors[piece.tensor].storage];
    CHECK(s.archive_range == (piece.offsets[0] == 0));
    if (piece.offsets[0] == 3) CHECK(data_of<float>(c, piece.tensor).front() == 12.0f);
  }
  CHECK(c.storages[*c.tensors[c.keys.tensor(key_index(c, "b"))].storage].archive_range);
  // A whole load refuses what was not opened; only a slice that avoids it can be read.
  std::vector<bool> all(c.storages.size(), true);
  CHECK_THROWS_AS(ckpt::detail::plan_reads(c, all, {}), ckpt::error);
}

TEST_CASE("dcp reader: broken directories, each with its intact twin") {
  const dir_files intact;
  CHECK(refusal(intact).second == "");

  SUBCASE("truncated .metadata") {
    dir_files d;
    d.metadata.resize(d.metadata.size() / 2);
    auto [kind, line] = refusal(d);
    CHECK(kind == ckpt::errc::corrupt);
    CHECK(line.rfind("mem/run/.metadata: byte ", 0) == 0);
  }
  SUBCASE("a chunk past the end of its file") {
    dir_files d;
    const ckpt::dcp::storage_item last = last_item(d, "__1_0.distcp");
    d.rank1.resize(d.rank1.size() - 10);
    auto [kind, line] = refusal(d);
    CHECK(kind == ckpt::errc::corrupt);
    CHECK(line.rfind("mem/run/__1_0.distcp: byte " + std::to_string(last.offset) + ": ", 0) == 0);
    CHECK(line.find("past the end") != std::string::npos);
  }
  SUBCASE("overlapping boxes") {
    dir_files d;
    d.metadata = fixture("overlap.metadata");
    auto [kind, line] = refusal(d);
    CHECK(kind == ckpt::errc::corrupt);
    CHECK(line.find("mem/run/.metadata: byte ") == 0);
    CHECK(line.find("tensor 'w': chunk (offsets (2, 0), sizes (3, 4)) overlaps chunk (offsets (0, 0), sizes (3, 4))") !=
          std::string::npos);
  }
  SUBCASE("a missing box") {
    dir_files d;
    d.metadata = fixture("gap.metadata");
    auto [kind, line] = refusal(d);
    CHECK(kind == ckpt::errc::corrupt);
    CHECK(line.find("tensor 'w': no chunk holds the elements at offsets (3, 0), sizes (2, 4)") != std::string::npos);
  }
  SUBCASE("an item whose embedded archive is corrupt") {
    dir_files d;
    // The last item's zip end record is the file's last 22 bytes: break its signature.
    const ckpt::dcp::storage_item last = last_item(d, "__1_0.distcp");
    REQUIRE(d.rank1.size() > 22);
    d.rank1[d.rank1.size() - 22] ^= 0xff;
    auto [kind, line] = refusal(d);
    CHECK(kind == ckpt::errc::corrupt);
    CHECK(line.rfind("mem/run/__1_0.distcp: ", 0) == 0);
    // The offset is the file's own (the slice's start added), inside the last item.
    const size_t at = line.find("byte ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoull(line.substr(at + 5)) >= last.offset);
  }
}
