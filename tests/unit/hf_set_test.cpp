// Hugging Face shard sets opened as one checkpoint (open_hf_set.cpp) from in-memory files:
// each corrupt set beside a success twin that differs only in the point the refusal is
// about, and the merge (file order, re-indexed storages, keys in shard order).
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"

using ckpt::errc;

namespace {

struct failure {
  errc kind;
  std::string file, line;
};

std::optional<failure> failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ckpt::error& e) {
    return failure{e.kind(), e.file(), e.one_line()};
  }
  return std::nullopt;
}

std::vector<uint8_t> sample(const std::string& name) {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/samples/" + name, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

using tensor_list = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// A safetensors file of F32 tensors, laid out as safetensors' writer does (formats.md §6):
// the header padded with spaces to a multiple of 8, the data in header order.
std::vector<uint8_t> safetensors_file(const tensor_list& tensors) {
  std::string json = "{";
  uint64_t at = 0;
  for (const auto& [name, shape] : tensors) {
    uint64_t n = 4;
    std::string dims;
    for (int64_t d : shape) {
      n *= uint64_t(d);
      dims += (dims.empty() ? "" : ",") + std::to_string(d);
    }
    json += (json.size() > 1 ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[" + dims +
            "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + n) + "]}";
    at += n;
  }
  json += "}";
  while (json.size() % 8) json += ' ';
  std::vector<uint8_t> out(8, 0);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(uint64_t(json.size()) >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  for (uint64_t i = 0; i < at; ++i) out.push_back(uint8_t(i * 7));
  return out;
}

const char* kIndex = "model.safetensors.index.json";
const char* kShard1 = "model-00001-of-00003.safetensors";
const char* kShard2 = "model-00002-of-00003.safetensors";
const char* kShard3 = "model-00003-of-00003.safetensors";

// The files of a good set, before one test changes them: names -> bytes, and the weight
// map as (key, shard), in the index's order (not the shards' order: the merge must not
// follow it).
struct set_files {
  std::vector<std::pair<std::string, std::string>> weight_map{
      {"c.w", kShard3}, {"a.w", kShard1}, {"a.b", kShard1}, {"b.w", kShard2}};
  std::vector<std::pair<std::string, tensor_list>> shards{
      {kShard1, {{"a.w", {2, 2}}, {"a.b", {2}}}}, {kShard2, {{"b.w", {3}}}}, {kShard3, {{"c.w", {1, 4}}}}};
  std::vector<std::pair<std::string, std::vector<uint8_t>>> extra;
  std::optional<uint64_t> total_size = 52;  // 13 floats
  std::string dir = "hf";

  std::string index_text() const {
    std::string map;
    for (const auto& [k, s] : weight_map) map += (map.empty() ? "" : ", ") + std::string("\"") + k + "\": \"" + s + "\"";
    std::string meta = total_size ? "\"metadata\": {\"total_size\": " + std::to_string(*total_size) + "}, " : "";
    return "{" + meta + "\"weight_map\": {" + map + "}}";
  }
  ckpt::memory_opener opener() const {
    ckpt::memory_opener m("mem");
    m.add(dir + "/" + kIndex, index_text());
    for (const auto& [name, tensors] : shards) m.add(dir + "/" + name, safetensors_file(tensors));
    for (const auto& [name, bytes] : extra) m.add(dir + "/" + name, bytes);
    return m;
  }
  ckpt::checkpoint open() const {
    const ckpt::memory_opener m = opener();
    return ckpt::open_checkpoint(dir, {}, m);
  }
  std::optional<failure> fails() const {
    const ckpt::memory_opener m = opener();
    return failure_of([&] { (void)ckpt::open_checkpoint(dir, {}, m); });
  }
};

std::vector<std::string> keys_of(const ckpt::checkpoint& c) {
  std::vector<std::string> out;
  for (size_t k = 0; k < c.keys.size(); ++k) out.emplace_back(c.keys.key(k));
  return out;
}

bool warned(const ckpt::checkpoint& c, const std::string& part) {
  for (const auto& w : c.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

void expect_refused(const set_files& s, errc kind, const std::string& file, const std::string& part) {
  auto f = s.fails();
  REQUIRE_MESSAGE(f, "opened: " << s.index_text());
  CHECK(f->kind == kind);
  CHECK(f->file == file);
  CHECK_MESSAGE(f->line.find(part) != std::string::npos, f->line);
  CHECK(f->line.find('\n') == std::string::npos);
}

}  // namespace

TEST_SUITE("hf shard set") {

TEST_CASE("a set opens as one checkpoint: shard order, re-indexed storages, keys by shard then file order") {
  const set_files s;
  const ckpt::memory_opener m = s.opener();
  for (const char* path : {"hf", "hf/model.safetensors.index.json"}) {
    CAPTURE(path);
    const ckpt::checkpoint c = ckpt::open_checkpoint(path, {}, m);
    CHECK(c.layout == ckpt::checkpoint_layout::hf_shard_set);
    CHECK(c.path == "mem/hf/model.safetensors.index.json");
    CHECK(c.index_path == c.path);
    CHECK(c.format == ckpt::file_format::safetensors);
    REQUIRE(c.files.size() == 3);
    CHECK(c.files[0].path == std::string("mem/hf/") + kShard1);
    CHECK(c.files[2].path == std::string("mem/hf/") + kShard3);
    CHECK(c.files[0].tensors == 2);
    CHECK(c.files[1].tensors == 1);
    CHECK(keys_of(c) == std::vector<std::string>{"a.w", "a.b", "b.w", "c.w"});
    REQUIRE(c.tensors.size() == 4);
    REQUIRE(c.storages.size() == 4);
    for (size_t k = 0; k < c.keys.size(); ++k) {
      const ckpt::tensor_record& t = c.tensors[c.keys.tensor(k)];
      REQUIRE(t.storage);
      const ckpt::storage_record& st = c.storages[*t.storage];
      CHECK(st.key == c.keys.key(k));  // a safetensors storage is named by its tensor
      CHECK(st.file == (k < 2 ? 0u : k == 2 ? 1u : 2u));
      CHECK(*st.file_offset + st.nbytes <= c.files[st.file].size);
    }
    CHECK(c.state_dict == ckpt::value_path{});
    CHECK(c.warnings.empty());
    CHECK(c.file_size() == c.files[0].size + c.files[1].size + c.files[2].size);
    // The index and three headers: no tensor byte.
    CHECK(c.bytes_read() > 0);
    CHECK(c.index_bytes_read == s.index_text().size());
  }
}

TEST_CASE("refused: the index names a missing shard; twin: every shard present") {
  set_files s;
  s.shards.erase(s.shards.begin() + 1);
  expect_refused(s, errc::corrupt, "mem/hf/model.safetensors.index.json",
                 "shard 'model-00002-of-00003.safetensors' (1 tensors in the index) does not exist");
  CHECK_FALSE(set_files().fails());
}

TEST_CASE("refused: one key in two shards; twin: the second copy under another name") {
  set_files s;
  s.shards[2].second.push_back({"b.w", {3}});
  expect_refused(s, errc::corrupt, "mem/hf/model.safetensors.index.json",
                 "tensor 'b.w' is held by shard 'model-00002-of-00003.safetensors' (the index's) and by shard "
                 "'model-00003-of-00003.safetensors'");
  set_files twin;
  twin.shards[2].second.push_back({"b.w2", {3}});
  twin.total_size = 64;
  const ckpt::checkpoint c = twin.open();
  // A key the index omits is loaded by every loader: read, and told.
  CHECK(keys_of(c) == std::vector<std::string>{"a.w", "a.b", "b.w", "c.w", "b.w2"});
  CHECK(warned(c, "tensor 'b.w2' in shard 'model-00003-of-00003.safetensors' is not in the index"));
}

TEST_CASE("refused: a key the index names that its shard lacks; twin: the shard holds it") {
  set_files s;
  s.weight_map.push_back({"a.extra", kShard1});
  expect_refused(s, errc::corrupt, "mem/hf/model.safetensors.index.json",
                 "tensor 'a.extra' is in the index under shard 'model-00001-of-00003.safetensors', which does not hold it");
  set_files twin = s;
  twin.shards[0].second.push_back({"a.extra", {1}});
  twin.total_size = 56;
  const ckpt::checkpoint c = twin.open();
  CHECK(keys_of(c) == std::vector<std::string>{"a.w", "a.b", "a.extra", "b.w", "c.w"});
  CHECK(c.warnings.empty());
}

TEST_CASE("refused: a shard name leaving the directory; twin: a shard in a subdirectory") {
  for (const char* bad : {"../model-00002-of-00003.safetensors", "/model-00002-of-00003.safetensors",
                          "sub/../model-00002-of-00003.safetensors", "sub\\\\model-00002-of-00003.safetensors",
                          "./model-00002-of-00003.safetensors"}) {
    CAPTURE(bad);
    set_files s;
    s.weight_map[3].second = bad;
    auto f = s.fails();
    REQUIRE(f);
    CHECK(f->kind == errc::unsafe);
    CHECK(f->file == "mem/hf/model.safetensors.index.json");
    CHECK_MESSAGE(f->line.find("shards must lie inside the index's directory") != std::string::npos, f->line);
  }
  set_files twin;
  twin.weight_map[3].second = std::string("sub/") + kShard2;
  twin.shards[1].first = std::string("sub/") + kShard2;
  const ckpt::checkpoint c = twin.open();
  CHECK(c.files[2].path == std::string("mem/hf/sub/") + kShard2);  // "sub/..." sorts after "model-..."
  CHECK(keys_of(c) == std::vector<std::string>{"a.w", "a.b", "c.w", "b.w"});
}

TEST_CASE("refused: a truncated shard, naming the shard; twin: whole") {
  set_files s;
  auto bytes = safetensors_file(s.shards[1].second);
  bytes.resize(bytes.size() - 4);
  s.extra.push_back({kShard2, bytes});  // replaces the whole shard
  auto f = s.fails();
  REQUIRE(f);
  CHECK(f->kind == errc::corrupt);
  CHECK(f->file == std::string("mem/hf/") + kShard2);
  CHECK_FALSE(set_files().fails());
}

TEST_CASE("of several broken shards, the first in shard order is named, however they were read") {
  // Shards are read ahead on several threads (open_hf_set.cpp read_ahead): what is reported
  // must still be what reading them in turn meets first. Twelve shards, three broken.
  set_files s;
  s.weight_map.clear();
  s.shards.clear();
  char name[64];
  for (int i = 1; i <= 12; ++i) {
    std::snprintf(name, sizeof name, "model-%05d-of-00012.safetensors", i);
    const std::string key = "k" + std::to_string(i);
    s.weight_map.push_back({key, name});
    s.shards.push_back({name, {{key, {2}}}});
  }
  s.total_size = 96;
  REQUIRE_FALSE(s.fails());
  for (int broken : {5, 9, 12}) {
    auto bytes = safetensors_file(s.shards[size_t(broken - 1)].second);
    bytes.resize(bytes.size() - 4);
    s.extra.push_back({s.shards[size_t(broken - 1)].first, bytes});
  }
  for (int round = 0; round < 20; ++round) {
    auto f = s.fails();
    REQUIRE(f);
    CHECK(f->kind == errc::corrupt);
    CHECK(f->file == "mem/hf/model-00005-of-00012.safetensors");
  }
  // A shard that is not safetensors inside is left to be read in turn, and refused there.
  s.extra.clear();
  s.extra.push_back({"model-00003-of-00012.safetensors", sample("plain.pt")});
  auto f = s.fails();
  REQUIRE(f);
  CHECK(f->file == "mem/hf/model-00003-of-00012.safetensors");
}

TEST_CASE("warnings: a file beside the index that no key names; no total_size; its twin is silent") {
  set_files s;
  s.extra.push_back({"model-00004-of-00003.safetensors", safetensors_file({{"z", {1}}})});
  s.total_size.reset();
  const ckpt::checkpoint c = s.open();
  CHECK(c.files.size() == 3);  // never read: no loader opens it
  CHECK(warned(c, "shard file 'model-00004-of-00003.safetensors' is beside the index but no tensor points to it"));
  CHECK(warned(c, "index has no \"metadata\""));
  CHECK(c.warnings.size() == 2);
  set_files wrong_size;
  wrong_size.total_size = 61;
  CHECK(warned(wrong_size.open(), "metadata.total_size is 61 bytes, the shards hold 52"));
}

TEST_CASE("shards the loaders fail on are corrupt; those they would read otherwise, unsupported") {
  // TorchScript as a .bin shard: torch.load would not return a state dict from it.
  set_files ts;
  ts.weight_map = {{"x", "pytorch_model-00001-of-00002.bin"}, {"b.w", kShard2}};
  ts.shards = {{kShard2, {{"b.w", {3}}}}};
  ts.extra.push_back({"pytorch_model-00001-of-00002.bin", sample("scripted.pt")});
  auto f = ts.fails();
  REQUIRE(f);
  CHECK(f->kind == errc::corrupt);
  CHECK(f->file == "mem/hf/pytorch_model-00001-of-00002.bin");

  // safetensors bytes under a .bin name: the loaders would torch.load them, and fail.
  set_files named;
  named.weight_map[3].second = "pytorch_model-00002-of-00003.bin";
  named.shards[1].first = "pytorch_model-00002-of-00003.bin";
  f = named.fails();
  REQUIRE(f);
  CHECK(f->kind == errc::corrupt);
  CHECK_MESSAGE(f->line.find("they choose the reader by the name") != std::string::npos, f->line);

  // A torch.save zip of a flat dict as a .bin shard next to safetensors ones: each would
  // load, but no writer mixes them.
  set_files mixed;
  mixed.weight_map = {{"0.weight", "pytorch_model-00001-of-00002.bin"}, {"b.w", kShard2}};
  mixed.shards = {{kShard2, {{"b.w", {3}}}}};
  mixed.extra.push_back({"pytorch_model-00001-of-00002.bin", sample("plain.pt")});
  f = mixed.fails();
  REQUIRE(f);
  CHECK(f->kind == errc::unsupported);
  CHECK_MESSAGE(f->line.find("mixing shard formats") != std::string::npos, f->line);
}

TEST_CASE("a set of .bin shards (torch.save zips of flat dicts) merges with its storages re-indexed") {
  // plain.pt holds 0.weight, 0.bias, 2.weight, 2.bias, 4.weight, 4.bias; two copies under
  // different names cannot share keys, so the index names the first copy's keys only and
  // the second shard's are keys the index omits... which would collide: one shard only.
  ckpt::memory_opener m("mem");
  m.add("bin/pytorch_model-00001-of-00001.bin", sample("plain.pt"));
  m.add("bin/pytorch_model.bin.index.json",
        std::string_view(R"({"metadata": {"total_size": 1}, "weight_map": {"0.weight": "pytorch_model-00001-of-00001.bin",
          "0.bias": "pytorch_model-00001-of-00001.bin", "2.weight": "pytorch_model-00001-of-00001.bin",
          "2.bias": "pytorch_model-00001-of-00001.bin", "4.weight": "pytorch_model-00001-of-00001.bin",
          "4.bias": "pytorch_model-00001-of-00001.bin"}})"));
  m.add("bin/model-extra.safetensors", safetensors_file({{"q", {1}}}));  // other extension: not an orphan
  const ckpt::checkpoint c = ckpt::open_checkpoint("bin", {}, m);
  CHECK(c.format == ckpt::file_format::torch_zip);
  CHECK(keys_of(c) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"});
  CHECK(c.files.size() == 1);
  REQUIRE(c.warnings.size() == 1);
  CHECK_MESSAGE(c.warnings[0].find("metadata.total_size is 1 bytes") != std::string::npos, c.warnings[0]);
}

TEST_CASE("rekey of a set is refused by the one-file rule, not misread") {
  const ckpt::checkpoint c = set_files().open();
  auto f = failure_of([&] { (void)c.single_file("rekey"); });
  REQUIRE(f);
  CHECK(f->kind == errc::unsupported);
}

}  // TEST_SUITE
