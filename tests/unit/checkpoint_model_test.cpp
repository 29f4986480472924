// The checkpoint model (include/ckpt/checkpoint.h, key_table.h): the key table's contract
// and cost, each reader's files[] and keys, and a checkpoint of two files planned and
// staged by (file, offset). Built from in-memory byte sources; the two-file checkpoint is
// put together by hand, as a sharded reader will put its shards together.
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/byteio.h"
#include "ckpt/byte_source.h"
#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/key_table.h"
#include "hostile_copy_engine.h"
#include "io/staging_pipeline.h"
#include "model/read_plan.h"

using ckpt::checkpoint;
using ckpt::errc;
using ckpt::key_table;

namespace {

// A safetensors file of float32 tensors, one per (name, element count), data bytes
// counting up from `first_byte`.
std::vector<uint8_t> safetensors_file(const std::vector<std::pair<std::string, int>>& tensors, uint8_t first_byte) {
  std::string json = "{";
  uint64_t at = 0;
  for (const auto& [name, n] : tensors) {
    if (json.size() > 1) json += ",";
    json += "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) + "],\"data_offsets\":[" +
            std::to_string(at) + "," + std::to_string(at + 4 * n) + "]}";
    at += 4 * uint64_t(n);
  }
  json += "}";
  while ((8 + json.size()) % 8) json += ' ';
  std::vector<uint8_t> out(8 + json.size() + at);
  ckpt::store_u64(out.data(), json.size());
  std::copy(json.begin(), json.end(), out.begin() + 8);
  for (uint64_t i = 0; i < at; ++i) out[8 + json.size() + i] = uint8_t(first_byte + i);
  return out;
}

checkpoint open_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  return ckpt::open_checkpoint(std::make_unique<ckpt::memory_source>(std::move(bytes), name));
}

std::vector<uint8_t> sample_bytes(const char* name) {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/samples/" + name, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> keys_of(const checkpoint& c) {
  std::vector<std::string> out;
  for (size_t k = 0; k < c.keys.size(); ++k) out.emplace_back(c.keys.key(k));
  return out;
}

// Appends b's file, storages, tensors and keys to a: what a sharded reader does with the
// shards it opens (file = i, storage and tensor indices shifted).
void append_file(checkpoint& a, checkpoint&& b) {
  const uint32_t file = uint32_t(a.files.size());
  const size_t storages = a.storages.size(), tensors = a.tensors.size();
  for (auto& f : b.files) a.files.push_back(std::move(f));
  for (auto s : b.storages) {
    s.file += file;
    a.storages.push_back(std::move(s));
  }
  for (auto t : b.tensors) {
    if (t.storage) *t.storage += storages;
    a.tensors.push_back(std::move(t));
  }
  for (size_t k = 0; k < b.keys.size(); ++k) a.keys.add(b.keys.key(k), b.keys.tensor(k) + tensors);
}

}  // namespace

TEST_CASE("key_table: one-piece keys take dtype and shape from their record") {
  std::vector<ckpt::tensor_record> tensors(2);
  tensors[0].type = ckpt::dtype::bfloat16;
  tensors[0].shape = {3, 4};
  tensors[1].shape = {7};
  key_table t;
  t.add("enc.weight", 0);
  t.add("", 1);  // an empty key is a key
  t.add("dec.weight", 0);  // tied to enc.weight
  REQUIRE(t.size() == 3);
  CHECK(t.key(0) == "enc.weight");
  CHECK(t.key(1) == "");
  CHECK(t.key(2) == "dec.weight");
  CHECK(t.tensor(2) == 0);
  CHECK(t.piece_count(0) == 1);
  CHECK(t.piece(1, 0).tensor == 1);
  CHECK(t.piece(1, 0).offsets.empty());
  CHECK(t.type(0, tensors) == ckpt::dtype::bfloat16);
  CHECK(t.shape(1, tensors) == std::vector<int64_t>{7});
  CHECK_THROWS(t.piece(0, 1));
  try {
    t.add("far", size_t(1) << 31);
    FAIL("a tensor index past the table's bound was taken");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::limit);
  }
  CHECK(t.size() == 3);
}

TEST_CASE("key_table: an assembled key has its own dtype and shape, and is refused as one record") {
  std::vector<ckpt::tensor_record> tensors(2);
  tensors[0].shape = {2, 8};
  tensors[1].shape = {2, 8};
  key_table t;
  t.add("w", 0);
  t.add("big", ckpt::dtype::float16, {4, 8}, {{0, {0, 0}}, {1, {2, 0}}});
  CHECK(t.key(1) == "big");
  CHECK(t.piece_count(1) == 2);
  CHECK(t.piece(1, 1).tensor == 1);
  CHECK(t.piece(1, 1).offsets == std::vector<int64_t>{2, 0});
  CHECK(t.type(1, tensors) == ckpt::dtype::float16);
  CHECK(t.shape(1, tensors) == std::vector<int64_t>{4, 8});
  try {
    (void)t.tensor(1);
    FAIL("an assembled key was read as one record");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::unsupported);
    CHECK(std::string(e.what()).find("'big'") != std::string::npos);
  }
  CHECK_THROWS(t.add("bad", ckpt::dtype::float16, {4}, {}));
  CHECK_THROWS(t.add("bad", ckpt::dtype::float16, {4}, {{0, {0, 0}}}));
}

TEST_CASE("key_table: a one-piece key costs 8 bytes besides its text") {
  key_table t;
  const size_t n = 100000;
  size_t text = 0;
  for (size_t i = 0; i < n; ++i) {
    std::string k = "layers." + std::to_string(i) + ".weight";
    text += k.size();
    t.add(k, i);
  }
  t.shrink_to_fit();
  CHECK(t.memory_bytes() <= text + 8 * n);
  CHECK(t.key(n - 1) == "layers." + std::to_string(n - 1) + ".weight");
}

TEST_CASE("safetensors: one file, every tensor a key, in header order") {
  checkpoint c = open_bytes(safetensors_file({{"b", 2}, {"a", 3}}, 0), "m.safetensors");
  REQUIRE(c.files.size() == 1);
  CHECK(c.files[0].format == ckpt::file_format::safetensors);
  CHECK(c.files[0].path == "m.safetensors");
  CHECK(c.files[0].size == c.file_size());
  CHECK(c.files[0].st_header);
  CHECK(keys_of(c) == std::vector<std::string>{"b", "a"});
  for (const auto& s : c.storages) CHECK(s.file == 0);
  CHECK(c.tensors[c.keys.tensor(1)].shape == std::vector<int64_t>{3});
}

TEST_CASE("torch zip: keys are the state dict's, the Lightning prefix left out, and outlive the pickle") {
  checkpoint c = open_bytes(sample_bytes("compiled_lightning.ckpt"), "l.ckpt");
  REQUIRE(c.files.size() == 1);
  CHECK(c.files[0].zip);
  CHECK(c.files[0].pickle);
  REQUIRE(c.state_dict);
  REQUIRE(c.keys.size() == 7);
  CHECK(c.keys.key(0) == "model._orig_mod.embed.weight");
  // Every key names the record whose path is the state dict's path plus the key.
  for (size_t k = 0; k < c.keys.size(); ++k) {
    const auto& path = c.tensors[c.keys.tensor(k)].path;
    REQUIRE(path.size() == 2);
    CHECK(std::get<std::string>(path[0]) == "state_dict");
    CHECK(std::get<std::string>(path[1]) == c.keys.key(k));
  }
  const std::vector<std::string> before = keys_of(c);
  ckpt::release_pickle(c);
  CHECK_FALSE(c.files[0].pickle);
  CHECK(keys_of(c) == before);
}

TEST_CASE("open for a pickle rewrite: the same tensors and state dict, without storages, keys, entries or paths") {
  ckpt::open_options lean;
  lean.intent = ckpt::open_options::purpose::rewrite_pickle;
  for (const char* sample : {"compiled_lightning.ckpt", "plain.pt", "scripted.pt"}) {
    CAPTURE(sample);
    checkpoint full = open_bytes(sample_bytes(sample), sample);
    checkpoint c = ckpt::open_checkpoint(std::make_unique<ckpt::memory_source>(sample_bytes(sample), sample), lean);
    REQUIRE(!full.storages.empty());
    CHECK(c.storages.empty());
    CHECK(c.keys.empty());
    CHECK(c.entries.empty());
    CHECK(c.aliases.empty());
    CHECK(c.format == full.format);
    CHECK(c.state_dict == full.state_dict);
    CHECK(c.globals == full.globals);
    CHECK(c.unsafe_globals == full.unsafe_globals);
    CHECK(bool(c.state_dict_node) == bool(full.state_dict_node));
    REQUIRE(c.tensors.size() == full.tensors.size());
    const auto& doc = *c.files[0].pickle;
    const auto& full_doc = *full.files[0].pickle;
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      const auto& t = c.tensors[i];
      const auto& f = full.tensors[i];
      CHECK(t.path.empty());
      CHECK(t.type == f.type);
      CHECK(t.shape == f.shape);
      CHECK(t.stride == f.stride);
      CHECK(t.storage_offset == f.storage_offset);
      // The index the storage's record would have had: data and meta told apart as before.
      CHECK(t.storage == f.storage);
      // The same rebuild call, in the tree of its own document (data.pkl or constants.pkl).
      if (doc.owns(t.node)) CHECK(t.node->id == f.node->id);
      if (full_doc.owns(f.node)) CHECK(doc.owns(t.node));
    }
  }
  // A safetensors header is read as it is for any purpose.
  checkpoint st = ckpt::open_checkpoint(
      std::make_unique<ckpt::memory_source>(safetensors_file({{"a", 2}}, 0), "a.safetensors"), lean);
  CHECK(st.storages.size() == 1);
  CHECK(keys_of(st) == std::vector<std::string>{"a"});
}

TEST_CASE("a checkpoint of one file refuses nothing; of two, single-file operations refuse") {
  checkpoint c = open_bytes(safetensors_file({{"a", 1}}, 0), "a.safetensors");
  CHECK(c.single_file("test").path == "a.safetensors");
  append_file(c, open_bytes(safetensors_file({{"b", 1}}, 0), "b.safetensors"));
  try {
    (void)c.single_file("rekey");
    FAIL("two files read as one");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::unsupported);
    CHECK(std::string(e.what()).find("rekey") != std::string::npos);
  }
}

TEST_CASE("two files: reads are planned by (file, offset) and staged from the right file") {
  // Both files put their tensors at the same offsets: a planner keyed by offset alone
  // would merge or mix them up.
  checkpoint c = open_bytes(safetensors_file({{"a.x", 16}, {"a.y", 16}}, 0), "a.safetensors");
  append_file(c, open_bytes(safetensors_file({{"b.x", 16}, {"b.y", 16}}, 100), "b.safetensors"));
  REQUIRE(c.files.size() == 2);
  REQUIRE(c.storages.size() == 4);
  CHECK(*c.storages[0].file_offset == *c.storages[2].file_offset);
  CHECK(c.storages[2].file == 1);
  CHECK(keys_of(c) == std::vector<std::string>{"a.x", "a.y", "b.x", "b.y"});
  CHECK(c.file_size() == c.files[0].size + c.files[1].size);

  ckpt::detail::read_plan plan = ckpt::detail::plan_reads(c, std::vector<bool>(4, true));
  REQUIRE(plan.reads.size() == 2);  // neighbours merge within a file, never across files
  CHECK(plan.reads[0].file == 0);
  CHECK(plan.reads[1].file == 1);
  CHECK(plan.reads[0].offset == plan.reads[1].offset);
  for (const auto& op : plan.reads)
    for (size_t p = op.first_piece; p < op.first_piece + op.piece_count; ++p)
      CHECK(c.storages[plan.pieces[p].storage].file == op.file);

  std::vector<std::vector<uint8_t>> got(4);
  std::vector<uint8_t*> dst(4);
  for (size_t i = 0; i < 4; ++i) {
    got[i].assign(c.storages[i].nbytes, 0xEE);
    dst[i] = got[i].data();
  }
  std::vector<uint8_t> ring(2 * 4096);
  ckpt::testing::hostile_copy_engine engine({2, 20, 1, std::nullopt, 0x5A});
  ckpt::detail::run_staging_pipeline(plan, ckpt::detail::file_sources(c), dst,
                                     ckpt::detail::staging_ring{ring.data(), 2, 4096}, engine, {});
  for (size_t i = 0; i < 4; ++i) {
    const auto& s = c.storages[i];
    CHECK(got[i] == c.files[s.file].source->read_vector(*s.file_offset, size_t(s.nbytes)));
  }
  CHECK(got[0] != got[2]);  // same offset, different files, different bytes
}

TEST_CASE("plan_reads refuses a storage in a file the checkpoint does not have") {
  checkpoint c = open_bytes(safetensors_file({{"a", 1}}, 0), "a.safetensors");
  c.storages[0].file = 1;
  CHECK_THROWS_AS(ckpt::detail::plan_reads(c, {true}), std::invalid_argument);
}
