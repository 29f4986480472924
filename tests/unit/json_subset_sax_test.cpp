// detail::json_subset_sax against nlohmann's parser: whatever text the quick reader takes,
// nlohmann takes too and feeds a handler the very same events (formats.md §6.2).
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "base/json_subset_sax.h"
#include "sax_log.h"

namespace {

using recorder = ckpt::fuzz::sax_log;

// True when the quick reader took `text`; nlohmann must then agree event for event.
bool agrees(const std::string& text) {
  recorder quick, full;
  if (!ckpt::detail::json_subset_sax(text, quick)) return false;
  const bool ok = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &full);
  CHECK_MESSAGE(ok, text);
  CHECK_MESSAGE(quick.log == full.log, text);
  return true;
}

const std::string kIndex =
    "{\n  \"metadata\": {\n    \"total_size\": 1072640000,\n    \"x\": [true, false, null, {}, []]\n  },\n"
    "  \"weight_map\": {\n    \"a.weight\": \"model-00001-of-00002.safetensors\",\n"
    "    \"b\": \"model-00002-of-00002.safetensors\"\n  }\n}";

}  // namespace

TEST_CASE("json_subset_sax: the writers' JSON gives nlohmann's events") {
  CHECK(agrees(kIndex));
  CHECK(agrees("{}"));
  CHECK(agrees(" [ ] "));
  CHECK(agrees("0"));
  CHECK(agrees("\"\""));
  CHECK(agrees("[[[[1,2],[3]],{\"\":{\"\":null}}]]"));
  CHECK(agrees("[9999999999999999999]"));
}

TEST_CASE("json_subset_sax: declines what it does not read exactly") {
  for (const char* text : {"", " ", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "[01]", "[-1]", "[1.5]", "[1e3]",
                           "[18446744073709551615]", "[\"\\n\"]", "[\"\xc3\xa9\"]", "[\"\t\"]", "[tru]", "[truex]",
                           "[nul]", "{} {}", "[1 2]", "{1:2}", "'a'", "[\"a\"x]", "[1]]", "[1}"}) {
    recorder r;
    CHECK_MESSAGE(!ckpt::detail::json_subset_sax(std::string(text), r), text);
  }
}

TEST_CASE("json_subset_sax: agrees with nlohmann on every single-byte change of an index") {
  size_t taken = 0, total = 0;
  for (size_t pos = 0; pos < kIndex.size(); ++pos)
    for (int c = 1; c < 256; ++c) {
      std::string text = kIndex;
      if (text[pos] == char(c)) continue;
      text[pos] = char(c);
      ++total;
      if (agrees(text)) ++taken;
    }
  CHECK(taken > 0);
  CHECK(taken < total);
}
