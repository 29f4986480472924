// ckpt::hf::parse_index and cross_check on in-memory indexes: each refusal next to a
// success twin that differs only in the point the refusal is about.
#include <doctest/doctest.h>

#include <string>

#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "formats/hf_index.h"

using ckpt::errc;
namespace hf = ckpt::hf;

namespace {

errc kind_of(const std::string& text, const hf::index_limits& lim = {}) {
  try {
    (void)hf::parse_index(text, lim);
  } catch (const ckpt::error& e) {
    return e.kind();
  }
  FAIL("parsed: " << text);
  return errc::usage;
}

const char* kTwo = R"({"metadata": {"total_size": 24, "total_parameters": 6},
  "weight_map": {"b.weight": "m-2.safetensors", "a.weight": "m-1.safetensors", "a.bias": "m-1.safetensors"}})";

hf::shard_contents shard(std::string name, std::vector<std::string> keys, uint64_t bytes = 8) {
  return {std::move(name), true, std::move(keys), bytes};
}

bool has(const hf::cross_check_result& r, hf::finding::what w, const std::string& key = "") {
  for (const auto& f : r.findings)
    if (f.kind == w && (key.empty() || f.key == key)) return true;
  return false;
}

}  // namespace

TEST_CASE("hf index: shards sorted, keys in file order, metadata read") {
  hf::index idx = hf::parse_index(kTwo);
  REQUIRE(idx.shards == std::vector<std::string>{"m-1.safetensors", "m-2.safetensors"});
  REQUIRE(idx.keys.size() == 3);
  CHECK(idx.keys[0].first == "b.weight");
  CHECK(idx.shards[idx.keys[0].second] == "m-2.safetensors");
  CHECK(idx.keys[2].first == "a.bias");
  CHECK(*idx.shard_of("a.weight") == "m-1.safetensors");
  CHECK(idx.shard_of("nope") == nullptr);
  CHECK(idx.total_size == 24u);
  CHECK(idx.total_parameters == 6u);
  CHECK(idx.has_metadata);
}

TEST_CASE("hf index: unknown fields tolerated, odd metadata noted") {
  hf::index idx = hf::parse_index(
      R"({"extra": [1, {"weight_map": 5}], "metadata": {"total_size": "12", "format": "pt", "x": {"y": null}},
          "weight_map": {"k": "s.bin"}})");
  CHECK(!idx.total_size);
  CHECK(idx.notes.size() == 1);
  CHECK(hf::parse_index(R"({"weight_map": {"k": "s.bin"}, "metadata": {"total_size": -1}})").notes.size() == 1);
  CHECK(!hf::parse_index(R"({"weight_map": {"k": "s.bin"}})").has_metadata);
}

TEST_CASE("hf index: malformed documents are corrupt, each beside a twin that parses") {
  // {refused, twin}
  const std::pair<const char*, const char*> cases[] = {
      {R"({"weight_map": {"k": "s.bin"})", R"({"weight_map": {"k": "s.bin"}})"},                   // truncated
      {R"({"weight_map": {"k": "s.bin", "k": "t.bin"}})", R"({"weight_map": {"k": "s.bin", "j": "t.bin"}})"},
      {R"({"metadata": {"a": 1, "a": 2}, "weight_map": {"k": "s.bin"}})",
       R"({"metadata": {"a": 1, "b": {"a": 2}}, "weight_map": {"k": "s.bin"}})"},                 // dup elsewhere
      {R"({"weight_map": {"k": 3}})", R"({"weight_map": {"k": "3"}})"},                            // not a string
      {R"({"weight_map": {"k": ["s.bin"]}})", R"({"weight_map": {"k": "s.bin"}})"},
      {R"({"weight_map": ["k", "s.bin"]})", R"({"weight_map": {"k": "s.bin"}})"},
      {R"({"metadata": 1, "weight_map": {"k": "s.bin"}})", R"({"metadata": {}, "weight_map": {"k": "s.bin"}})"},
      {R"({"weightmap": {"k": "s.bin"}})", R"({"weight_map": {"k": "s.bin"}, "weightmap": 1})"},  // no weight_map
      {R"({"weight_map": {}})", R"({"weight_map": {"": "s.bin"}})"},                               // names nothing
      {R"([{"weight_map": {"k": "s.bin"}}])", R"({"weight_map": {"k": "s.bin"}})"},
      {R"({"weight_map": {"k": "s.bin"}} x)", R"({"weight_map": {"k": "s.bin"}} )"},
      {"{\"weight_map\": {\"k\": \"s\xff.bin\"}}", "{\"weight_map\": {\"k\": \"s\xc3\xa9.bin\"}}"},  // UTF-8
      {"", "{\"weight_map\": {\"k\": \"s.bin\"}}"},
  };
  for (const auto& c : cases) {
    // Not a structured binding: CAPTURE's lambda cannot name one in C++17 (clang refuses).
    const char* bad = c.first;
    const char* good = c.second;
    CAPTURE(bad);
    CHECK(kind_of(bad) == errc::corrupt);
    CHECK_NOTHROW(hf::parse_index(good));
  }
}

TEST_CASE("hf index: a JSON syntax error carries its byte offset") {
  try {
    hf::parse_index(R"({"weight_map": {"k": "s.bin",}})");
    FAIL("parsed");
  } catch (const ckpt::error& e) {
    REQUIRE(e.offset());
    CHECK(*e.offset() == 29);
  }
}

TEST_CASE("hf index: shard names must stay inside the directory") {
  // As huggingface_hub's check (PureWindowsPath): either separator, and a drive letter,
  // which makes "a:b.bin" a drive-relative path on Windows.
  for (const char* bad : {"../x.safetensors", "a/../../x.bin", "/etc/x.bin", "\\x.bin", "..\\x.bin", "C:x.bin",
                          "c:\\x.bin", "a:b.bin"}) {
    CAPTURE(bad);
    CHECK(!ckpt::relative_name_problem(bad).empty());
    std::string quoted;
    for (const char* c = bad; *c; ++c) quoted += *c == '\\' ? std::string("\\\\") : std::string(1, *c);
    CHECK(kind_of(R"({"weight_map": {"k": ")" + quoted + "\"}}") == errc::unsafe);
  }
  for (const char* odd : {"", "a//b.bin", "sub/", "./x.bin", "."}) {
    CAPTURE(odd);
    CHECK(!ckpt::relative_name_problem(odd).empty());
  }
  CHECK(kind_of(R"({"weight_map": {"k": "a\u0000b"}})") == errc::unsafe);
  // Twins: names transformers and huggingface_hub both load.
  for (const char* good : {"x.safetensors", "sub/x.safetensors", "model.safetensors-00001-of-00014.safetensors",
                           "..x.bin", "x..bin", "ab:c.bin"})
    CHECK_MESSAGE(ckpt::relative_name_problem(good).empty(), good);
}

TEST_CASE("hf index: limits") {
  hf::index_limits lim;
  lim.max_keys = 2;
  CHECK(kind_of(R"({"weight_map": {"a": "s", "b": "s", "c": "s"}})", lim) == errc::limit);
  CHECK_NOTHROW(hf::parse_index(R"({"weight_map": {"a": "s", "b": "s"}})", lim));
  lim = {};
  lim.max_shards = 1;
  CHECK(kind_of(R"({"weight_map": {"a": "s", "b": "t"}})", lim) == errc::limit);
  CHECK_NOTHROW(hf::parse_index(R"({"weight_map": {"a": "s", "b": "s"}})", lim));
  lim = {};
  lim.max_bytes = 20;
  CHECK(kind_of(R"({"weight_map": {"a": "s"}})", lim) == errc::limit);
  lim = {};
  lim.max_name = 3;
  CHECK(kind_of(R"({"weight_map": {"a": "abcd"}})", lim) == errc::limit);
  CHECK(kind_of(std::string(R"({"x": )") + std::string(1000, '[') + std::string(1000, ']') +
                R"(, "weight_map": {"a": "s"}})") == errc::limit);
}

TEST_CASE("hf cross-check: a consistent set has no findings") {
  hf::index idx = hf::parse_index(kTwo);
  auto r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias"}, 16),
                                 shard("m-2.safetensors", {"b.weight"})});
  CHECK(r.findings.empty());
}

TEST_CASE("hf cross-check: each rule, beside its twin") {
  hf::index idx = hf::parse_index(kTwo);
  using W = hf::finding::what;

  auto r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias"}, 16)});
  CHECK(has(r, W::missing_shard));
  CHECK(r.errors() == 1);  // its keys are not reported one by one
  hf::shard_contents gone = shard("m-2.safetensors", {});
  gone.present = false;
  CHECK(has(hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias"}, 16), gone}), W::missing_shard));

  r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight"}, 16), shard("m-2.safetensors", {"b.weight"})});
  CHECK(has(r, W::key_missing_from_shard, "a.bias"));
  CHECK(r.errors() == 1);

  r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias"}, 16),
                            shard("m-2.safetensors", {"b.weight", "a.bias"})});
  CHECK(has(r, W::key_in_two_shards, "a.bias"));
  CHECK(r.errors() == 1);
  // Twin: the same key in a file the index never names is that file's business.
  r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias"}, 16), shard("m-2.safetensors", {"b.weight"}),
                            shard("consolidated.safetensors", {"a.bias"})});
  CHECK(r.errors() == 0);
  CHECK(has(r, W::orphan_shard));

  r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias", "c"}, 16),
                            shard("m-2.safetensors", {"b.weight", "d"})});
  CHECK(r.errors() == 0);
  CHECK(has(r, W::key_not_in_index, "c"));
  CHECK(has(r, W::key_not_in_index, "d"));
  // The same unnamed key in two of the index's shards: no loader agrees on which copy.
  r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias", "c"}, 16),
                            shard("m-2.safetensors", {"b.weight", "c"})});
  CHECK(r.errors() == 1);
  CHECK(has(r, W::key_in_two_shards, "c"));

  r = hf::cross_check(idx, {shard("m-1.safetensors", {"a.weight", "a.bias"}, 17), shard("m-2.safetensors", {"b.weight"})});
  CHECK(r.errors() == 0);
  CHECK(has(r, W::total_size_mismatch));

  hf::index bare = hf::parse_index(R"({"weight_map": {"k": "s"}})");
  r = hf::cross_check(bare, {shard("s", {"k"})});
  CHECK(r.errors() == 0);
  CHECK(has(r, W::no_total_size));
}

TEST_CASE("hf orphan candidates: same extension as the index's shards, index files excluded") {
  hf::index idx = hf::parse_index(kTwo);
  auto o = hf::orphan_candidates(idx, {"m-1.safetensors", "m-2.safetensors", "m-3.safetensors", "config.json",
                                       "model.safetensors.index.json", "pytorch_model.bin", "x.safetensors"});
  CHECK(o == std::vector<std::string>{"m-3.safetensors", "x.safetensors"});
}

TEST_CASE("hf index: by_key stays valid through moves (short keys live inside their strings)") {
  std::string text = R"({"weight_map": {)";
  for (int i = 0; i < 300; ++i) text += (i ? ", " : "") + std::string("\"k") + std::to_string(i) + "\": \"s\"";
  text += "}}";
  hf::index a = hf::parse_index(text);
  hf::index b = std::move(a);
  std::vector<hf::index> many;
  for (int i = 0; i < 4; ++i) many.push_back(hf::parse_index(text));  // reallocations move them
  many.push_back(std::move(b));
  for (const auto& idx : many) {
    REQUIRE(idx.by_key.size() == 300);
    CHECK(idx.shard_of("k0") != nullptr);
    CHECK(idx.shard_of("k299") != nullptr);
    CHECK(idx.shard_of("k300") == nullptr);
  }
}

TEST_CASE("hf index: the shards alone, for listing a set's files") {
  const hf::index whole = hf::parse_index(kTwo);
  const hf::index listed = hf::parse_index_shards(kTwo);
  CHECK(listed.shards == whole.shards);
  CHECK(listed.total_size == whole.total_size);
  CHECK(listed.total_parameters == whole.total_parameters);
  CHECK(listed.keys.empty());
  CHECK(listed.by_key.empty());
  // Every refusal but a key named twice in weight_map, which the set's reader reports.
  const std::string twice = R"({"weight_map": {"a": "m-1.safetensors", "a": "m-2.safetensors"}})";
  CHECK(kind_of(twice) == errc::corrupt);
  CHECK(hf::parse_index_shards(twice).shards.size() == 2);
  for (const char* bad : {R"({"weight_map": {}})", R"({"weight_map": {"a": "../m.safetensors"}})", R"({"x": 1})",
                          R"({"weight_map": {"a": 1}})", "{"}) {
    errc whole_kind = errc::usage, listed_kind = errc::usage;
    std::string whole_line, listed_line;
    try {
      (void)hf::parse_index(bad);
    } catch (const ckpt::error& e) {
      whole_kind = e.kind();
      whole_line = e.one_line();
    }
    try {
      (void)hf::parse_index_shards(bad);
    } catch (const ckpt::error& e) {
      listed_kind = e.kind();
      listed_line = e.one_line();
    }
    CHECK_MESSAGE(whole_kind != errc::usage, bad);
    CHECK(listed_kind == whole_kind);
    CHECK(listed_line == whole_line);
  }
  hf::index_limits lim;
  lim.max_keys = 2;
  CHECK_THROWS_AS((void)hf::parse_index_shards(kTwo, lim), ckpt::error);
}
