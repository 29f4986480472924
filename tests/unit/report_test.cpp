// The streamed inspect document must be byte for byte what nlohmann's dump(2) printed
// before it: scripts diff these reports, and `schema` promises a stable layout.
#include <doctest/doctest.h>

#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/report.h"
#include "report/json_writer.h"

using ckpt::detail::json_writer;
using nlohmann::json;

namespace {

// Replays a tree through the writer; nlohmann iterates object members in key order, which
// is the order the writer requires.
void replay(json_writer& w, const json& j) {
  switch (j.type()) {
    case json::value_t::object:
      w.begin_object();
      for (auto it = j.begin(); it != j.end(); ++it) {
        w.key(it.key());
        replay(w, it.value());
      }
      w.end_object();
      break;
    case json::value_t::array:
      w.begin_array();
      for (const auto& e : j) replay(w, e);
      w.end_array();
      break;
    case json::value_t::string: w.string(j.get_ref<const std::string&>()); break;
    case json::value_t::number_unsigned: w.number(j.get<uint64_t>()); break;
    case json::value_t::number_integer: w.number(j.get<int64_t>()); break;
    case json::value_t::boolean: w.boolean(j.get<bool>()); break;
    case json::value_t::null: w.null(); break;
    default: w.value(j); break;
  }
}

std::string written(const json& j, int indent = 2) {
  std::string out;
  json_writer w([&](std::string_view piece) { out += piece; }, indent);
  replay(w, j);
  w.flush();
  return out;
}

std::string inspect_text(const ckpt::checkpoint& c, const ckpt::inspect_json_options& o = {}) {
  std::string out;
  ckpt::write_inspect_json(c, o, [&](std::string_view piece) { out += piece; });
  return out;
}

}  // namespace

TEST_CASE("json_writer lays out documents as nlohmann's dump(2) does") {
  json doc = json::object();
  doc["empty_array"] = json::array();
  doc["empty_object"] = json::object();
  doc["numbers"] = {0, -1, int64_t(INT64_MIN), uint64_t(UINT64_MAX), 42};
  doc["flags"] = {true, false, nullptr};
  doc["strings"] = {"plain", "quote\" back\\slash", "tab\tnew\nline", std::string("nul\0x", 5), "del\x7f",
                    "caf\xc3\xa9", "bad \xff utf8", "lone \xed\xb2\x80 surrogate", ""};
  doc["k\xc3\xa9y \"odd\""] = 1;
  json deep = "bottom";
  for (int i = 0; i < 40; ++i) deep = json{{"level", deep}, {"list", {i, json::array()}}};
  doc["deep"] = deep;
  CHECK(written(doc) == ckpt::json_text(doc));
  CHECK(written(json::array()) == "[]");
  CHECK(written(json("x")) == "\"x\"");
}

TEST_CASE("json_writer compact lays out documents as nlohmann's dump() does") {
  json doc = json::object();
  doc["empty_array"] = json::array();
  doc["empty_object"] = json::object();
  doc["numbers"] = {0, -1, int64_t(INT64_MIN), uint64_t(UINT64_MAX), 42};
  doc["strings"] = {"plain", "quote\" back\\slash", "tab\tnew\nline", "bad \xff utf8", ""};
  json deep = "bottom";
  for (int i = 0; i < 40; ++i) deep = json{{"level", deep}, {"list", {i, json::array()}}};
  doc["deep"] = deep;
  CHECK(written(doc, -1) == ckpt::json_text(doc, -1));
  CHECK(written(json::array(), -1) == "[]");

  // A prebuilt value inside a streamed container, as the inspect document embeds "totals".
  json inner = {{"a", {1, 2}}, {"b", {{"c", "\xed\xb2\x80"}}}};
  std::string out;
  json_writer w([&](std::string_view piece) { out += piece; }, -1);
  w.begin_object();
  w.key("x");
  w.begin_array();
  w.value(inner);
  w.end_array();
  w.end_object();
  w.flush();
  CHECK(out == ckpt::json_text(json{{"x", {inner}}}, -1));
}

TEST_CASE("json_writer escapes every byte that needs it, wherever it sits in a string") {
  // Strings are checked for bytes to escape eight at a time: each byte value at each place
  // of the words and of the tail.
  for (int byte = 0; byte < 256; ++byte) {
    for (size_t at = 0; at < 19; ++at) {
      std::string s(19, 'a');
      s[at] = char(byte);
      CAPTURE(byte);
      CAPTURE(at);
      REQUIRE(written(json(s), -1) == ckpt::json_text(json(s), -1));
    }
  }
}

TEST_CASE("json_writer checks strings of every length, the short ones and the overlapping tail") {
  // Under eight bytes a string is checked byte by byte; from eight on, its last word
  // overlaps what the word loop already checked.
  for (size_t len = 1; len <= 25; ++len)
    for (int byte : {0x00, 0x1f, 0x22, 0x5c, 0x7f, 0x80, 0xc3, 0xff}) {
      for (size_t at = 0; at < len; ++at) {
        std::string s(len, 'a');
        s[at] = char(byte);
        CAPTURE(len);
        CAPTURE(byte);
        CAPTURE(at);
        REQUIRE(written(json(s), -1) == ckpt::json_text(json(s), -1));
        REQUIRE(written(json(s)) == ckpt::json_text(json(s)));
      }
    }
}

TEST_CASE("json_writer's literal keys and integer arrays lay out as nlohmann's dump does") {
  // The inspect document's own member names take the literal-key path, its shapes and
  // offsets the integer-array path: both at every depth up to past the one-piece
  // indentation, indented and compact, with padding and empty arrays.
  for (int indent : {2, -1}) {
    for (int depth = 0; depth < 36; ++depth) {
      std::string out;
      json_writer w([&](std::string_view piece) { out += piece; }, indent);
      json expect = json::object();
      json* at = &expect;
      for (int d = 0; d < depth; ++d) {
        w.begin_object();
        w.key("down");
        at = &((*at)["down"] = json::object());
      }
      w.begin_object();
      const int64_t dims[] = {419, -64, INT64_MIN, INT64_MAX, 0};
      w.key("empty");
      w.ints(dims, 0);
      w.key("padded");
      w.ints(dims, 2, 4);
      w.key("shape");
      w.ints(dims, 5);
      w.key("zeros");
      w.ints(dims, 0, 2);
      w.end_object();
      (*at)["empty"] = json::array();
      (*at)["padded"] = {419, -64, 0, 0};
      (*at)["shape"] = {419, -64, INT64_MIN, INT64_MAX, 0};
      (*at)["zeros"] = {0, 0};
      for (int d = 0; d < depth; ++d) w.end_object();
      w.flush();
      CAPTURE(indent);
      CAPTURE(depth);
      REQUIRE(out == ckpt::json_text(expect, indent));
    }
  }
}

TEST_CASE("json_writer embeds prebuilt values at the current indentation") {
  json inner = {{"a", {1, 2}}, {"b", {{"c", "\xed\xb2\x80"}}}};
  std::string out;
  json_writer w([&](std::string_view piece) { out += piece; });
  w.begin_object();
  w.key("x");
  w.begin_array();
  w.value(inner);
  w.end_array();
  w.end_object();
  w.flush();
  CHECK(out == ckpt::json_text(json{{"x", {inner}}}));
}

TEST_CASE("json_writer output larger than its buffer arrives whole and in order") {
  json big = json::array();
  for (int i = 0; i < 20000; ++i) big.push_back({{"i", i}, {"s", std::string(size_t(i % 300), 'a')}});
  CHECK(written(big) == ckpt::json_text(big));
}

TEST_CASE("the inspect document is sorted and laid out as nlohmann prints it") {
  for (const char* name : {"plain.pt", "compiled_lightning.ckpt", "model.safetensors"}) {
    CAPTURE(name);
    ckpt::checkpoint c = ckpt::open_checkpoint(std::string(CKPT_SOURCE_DIR) + "/samples/" + name);
    ckpt::inspect_json_options o;
    o.extra["ckptool_version"] = "9.9.9";
    o.extra["module"] = {{"type", "__torch__.Net"}, {"methods", json::array()}};
    o.extra_bytes_read = 1000;
    const std::string text = inspect_text(c, o);
    const json parsed = json::parse(text);
    CHECK(parsed.dump(2) == text);
    CHECK(parsed["ckptool_version"] == "9.9.9");
    CHECK(parsed["module"]["type"] == "__torch__.Net");
    CHECK(parsed["io"]["bytes_read"].get<uint64_t>() >= 1000);
    CHECK(parsed["tensors"].size() == c.tensors.size());
    CHECK(parsed["storages"].size() == c.storages.size());
    CHECK(parsed["totals"]["tensors"].get<size_t>() == c.tensors.size());
    o.indent = -1;
    CHECK(inspect_text(c, o) == parsed.dump());
  }
}

TEST_CASE("keep_tensor filters the tensor table only") {
  ckpt::checkpoint c = ckpt::open_checkpoint(std::string(CKPT_SOURCE_DIR) + "/samples/plain.pt");
  REQUIRE(c.tensors.size() > 1);
  ckpt::inspect_json_options o;
  const ckpt::tensor_record* first = &c.tensors[0];
  o.keep_tensor = [&](const ckpt::tensor_record& t) { return &t == first; };
  const json parsed = json::parse(inspect_text(c, o));
  CHECK(parsed["tensors"].size() == 1);
  CHECK(parsed["totals"]["tensors"].get<size_t>() == c.tensors.size());
  CHECK(parsed["storages"].size() == c.storages.size());
}
