// detail::parse_ordered_json and ordered_object_builder (src/base/ordered_json.h) against
// nlohmann::ordered_json's own parser and operator[]: the same values, member for member.
#include <doctest/doctest.h>

#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/ordered_json.h"

using ckpt::detail::json_failure;
using ckpt::detail::ordered_object_builder;
using ckpt::detail::left_out_members;
using ckpt::detail::parse_ordered_json;
using json = nlohmann::ordered_json;

namespace {

json parse(const std::string& text, size_t max_depth = 200) {
  return parse_ordered_json(text, max_depth, [](const json_failure& f) {
    throw std::runtime_error((f.too_deep ? "deep: " : "invalid: ") + f.what);
  });
}

std::string failure(const std::string& text, size_t max_depth = 200) {
  try {
    parse(text, max_depth);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("ordered json: parses as ordered_json::parse does") {
  // Member order as first seen, a repeated key's last value in its first place, every kind
  // of value, nested containers.
  const std::string texts[] = {
      R"({"b": 1, "a": [true, null, -3, 18446744073709551615, 2.5e-3, "x\u00e9"], "c": {}})",
      R"({"k": 1, "j": {"z": [1, {"y": 2}]}, "k": [3], "i": "s"})",
      R"([{"a": 1, "a": 2, "b": {"a": 3}}, [], [[[]]], "tail"])",
      R"("just a string")",
      R"(  {"nested": {"nested": {"nested": {"k": "v", "k": {"w": [1]}}}}}  )",
      "-0.0",
  };
  // Wide objects of wide objects: every level's member vector grows many times while the
  // members under it are already filled.
  std::string wide = "{";
  for (int i = 0; i < 40; ++i) {
    wide += (i ? ",\"m" : "\"m") + std::to_string(i % 37) + "\": {";
    for (int j = 0; j < 30; ++j)
      wide += (j ? ",\"n" : "\"n") + std::to_string(j) + "\": [{\"x\": " + std::to_string(i * j) + "}, \"s\"]";
    wide += "}";
  }
  wide += "}";
  std::vector<std::string> all(std::begin(texts), std::end(texts));
  all.push_back(wide);
  for (const std::string& t : all) {
    const json ours = parse(t);
    const json theirs = json::parse(t);
    CHECK_MESSAGE(ours == theirs, t);
    CHECK_MESSAGE(ours.dump() == theirs.dump(), t);
  }
}

TEST_CASE("ordered json: many members in order, and what is refused") {
  // An object of many members (a program's tensor_values, an index's weight_map): the
  // old parser's per-key scan made this quadratic.
  std::string many = "{";
  for (int i = 0; i < 100000; ++i) many += (i ? ", \"v" : "\"v") + std::to_string(i) + "\": " + std::to_string(i);
  many += ", \"v7\": -1}";
  const json doc = parse(many);
  REQUIRE(doc.size() == 100000);
  CHECK(doc.begin().key() == "v0");
  CHECK(doc["v7"] == -1);
  CHECK(std::next(doc.begin(), 7).key() == "v7");
  CHECK(std::prev(doc.end()).key() == "v99999");

  // The bound counts the containers around a new one: 4 arrays nest inside 3 others.
  CHECK_NOTHROW(parse("[[[[]]]]", 3));
  CHECK(failure("[[[[[]]]]]", 3) == "deep: nested deeper than 3 levels");
  CHECK(failure("{\"a\": {\"b\": {\"c\": {\"d\": {}}}}}", 3) == "deep: nested deeper than 3 levels");
  CHECK(failure("{} x").rfind("invalid: ", 0) == 0);
  CHECK(failure("").rfind("invalid: ", 0) == 0);
  CHECK(failure("{\"a\": }").rfind("invalid: ", 0) == 0);
  CHECK(failure("[1, 2").rfind("invalid: ", 0) == 0);
}

TEST_CASE("ordered json: a left-out member is skipped, checked as JSON, and nothing else is") {
  auto without = [](const std::string& text, const left_out_members& members) {
    return parse_ordered_json(text, 4, [](const json_failure& f) {
      throw std::runtime_error((f.too_deep ? "deep: " : "invalid: ") + f.what);
    }, members);
  };
  const left_out_members nodes = {{"gm", "graph"}, {"nodes"}};
  // The expected value: nlohmann's parse with the member erased where the path leads.
  const std::string text =
      R"({"nodes": 1, "gm": {"nodes": [2], "graph": {"x": [{"nodes": 3}], "nodes": [[[[[{"a": 1}]]]]], )"
      R"("graph": {"nodes": 4}, "nodes": "again", "y": {"nodes": 5}}, "z": [{"graph": {"nodes": 6}}]}, "w": 7})";
  json expected = json::parse(text);
  expected["gm"]["graph"].erase("nodes");
  const json got = without(text, nodes);
  CHECK(got == expected);
  CHECK(got.dump() == expected.dump());
  CHECK(got["gm"]["graph"].find("nodes") == got["gm"]["graph"].end());
  CHECK(got["gm"]["graph"]["graph"]["nodes"] == 4);  // the path is from the root only
  CHECK(got["gm"]["nodes"] == json::array({2}));
  // Scalars and containers alike; the skipped value's nesting is not counted (it is never walked).
  CHECK(without(R"({"gm": {"graph": {"nodes": null, "k": 1}}})", nodes) == json::parse(R"({"gm": {"graph": {"k": 1}}})"));
  CHECK(without(R"({"gm": {"graph": {"nodes": {"a": {"b": [[[1]]]}}}}})", nodes) == json::parse(R"({"gm": {"graph": {}}})"));
  // The path through an array is not the path.
  CHECK(without(R"({"gm": [{"graph": {"nodes": 1}}]})", nodes) == json::parse(R"({"gm": [{"graph": {"nodes": 1}}]})"));
  // Invalid JSON inside the skipped value is still refused.
  const std::string bad[] = {R"({"gm": {"graph": {"nodes": [1, }}})", R"({"gm": {"graph": {"nodes": "\x"}}})",
                             "{\"gm\": {\"graph\": {\"nodes\": \"\xff\"}}}", R"({"gm": {"graph": {"nodes": [}}})"};
  for (const std::string& b : bad) {
    std::string what;
    try {
      without(b, nodes);
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
    CHECK_MESSAGE(what.rfind("invalid: ", 0) == 0, b);
  }
  // No name: nothing is left out.
  CHECK(without(R"({"gm": {"graph": {"nodes": 1}}})", {}) == json::parse(R"({"gm": {"graph": {"nodes": 1}}})"));
  CHECK(without(R"({"gm": {"graph": {"nodes": 1}}})", {{"gm", "graph"}, {}}) ==
        json::parse(R"({"gm": {"graph": {"nodes": 1}}})"));
  // Several names under one parent, in any order, each a repeated key too; at the root.
  const left_out_members two = {{"gm", "graph"}, {"nodes", "values"}};
  CHECK(without(R"({"gm": {"graph": {"values": {"a": 1}, "k": 2, "nodes": [3], "values": 4, "v": {"nodes": 5}}}})", two) ==
        json::parse(R"({"gm": {"graph": {"k": 2, "v": {"nodes": 5}}}})"));
  CHECK(without(R"({"nodes": [1], "gm": 2, "values": {}})", {{}, {"nodes", "values"}}) == json::parse(R"({"gm": 2})"));
}

TEST_CASE("ordered json: the builder appends and replaces as operator[] does") {
  ordered_object_builder b;
  json reference = json::object();
  const std::pair<std::string, int> sets[] = {{"z", 1}, {"a", 2}, {"z", 3}, {"m", 4}, {"a", 5}};
  for (const auto& [k, v] : sets) {
    b.set(k, v);
    reference[k] = v;
  }
  const json built = b.take();
  CHECK(built == reference);
  CHECK(built.dump() == R"({"z":3,"a":5,"m":4})");
}
