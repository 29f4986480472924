// The fast scanner of safetensors headers against the full parser it stands in front of
// (formats.md §6.2): whatever the scanner accepts, the full parser accepts with the same
// tensors and metadata; what it declines, read_header still reads or refuses exactly.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/safetensors.h"
#include "formats/safetensors_scan.h"

namespace st = ckpt::safetensors;
using st::detail::raw_tensor;

namespace {

using pairs = std::vector<std::pair<std::string, std::string>>;

bool scanned(const std::string& json, std::vector<raw_tensor>& t, pairs& m, const st::limits& lim = {}) {
  return st::detail::scan_header(json, {lim.max_tensors, lim.max_name_length, lim.max_rank}, t, m);
}

// True when the scanner took the header; then the full parser must agree field for field.
bool agrees(const std::string& json, const st::limits& lim = {}) {
  std::vector<raw_tensor> fast, full;
  pairs fast_md, full_md;
  if (!scanned(json, fast, fast_md, lim)) return false;
  try {
    st::detail::parse_header_json(json, lim, full, full_md);
  } catch (const ckpt::error& e) {
    FAIL("the scanner accepted what the parser refuses (" << e.message() << "): " << json.substr(0, 200));
  }
  REQUIRE(fast.size() == full.size());
  for (size_t i = 0; i < fast.size(); ++i) {
    CHECK(fast[i].name == full[i].name);
    CHECK(fast[i].dtype == full[i].dtype);
    CHECK(fast[i].shape == full[i].shape);
    CHECK(fast[i].offset_count == full[i].offset_count);
    CHECK(fast[i].offsets[0] == full[i].offsets[0]);
    CHECK(fast[i].offsets[1] == full[i].offsets[1]);
  }
  CHECK(fast_md == full_md);
  return true;
}

const std::string kWriter =
    "{\"__metadata__\":{\"format\":\"pt\"},\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[419,64],"
    "\"data_offsets\":[0,53632]},\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[53632,53636]}}    ";

}  // namespace

TEST_CASE("scanner reads the writers' headers as the parser does") {
  CHECK(agrees(kWriter));
  CHECK(agrees("{}"));
  CHECK(agrees(" \t\r\n{ } \n"));
  CHECK(agrees("{\"__metadata__\":{}}"));
  CHECK(agrees("{\"x\" : { \"shape\" : [ 1 , 2 ] , \"data_offsets\" : [ 0 , 8 ] , \"dtype\" : \"U8\" } }"));
  CHECK(agrees("{\"x\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[0,0]}}"));
  CHECK(agrees("{\"x\":{\"dtype\":\"F64\",\"shape\":[9999999999999999999],\"data_offsets\":[0,0]}}"));
  CHECK(agrees("{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]},\"__metadata__\":{\"k\":\"v\",\"k2\":\"\"}}"));
}

TEST_CASE("scanner declines what it cannot read exactly, and the parser decides") {
  const char* declined[] = {
      "{\"a\\u0062\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}",  // escape
      "{\"\xc3\xa9\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}",    // non-ASCII name
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[01],\"data_offsets\":[0,1]}}",          // leading zero
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[-1],\"data_offsets\":[0,1]}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[18446744073709551615],\"data_offsets\":[0,1]}}",  // 20 digits
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0]}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1]}}",
      "{\"a\":{\"dtype\":\"I8\",\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
      "{\"__metadata__\":{},\"__metadata__\":{}}",
      "{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}",
      "{\"__metadata__\":{\"k\":1}}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]},}",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}} x",
      "{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}",
      "[]",
      "",
  };
  for (const char* json : declined) {
    std::vector<raw_tensor> t;
    pairs m;
    CHECK_MESSAGE(!scanned(json, t, m), json);
  }
  st::limits small;
  small.max_rank = 1;
  std::vector<raw_tensor> t;
  pairs m;
  CHECK(!scanned("{\"a\":{\"dtype\":\"I8\",\"shape\":[1,1],\"data_offsets\":[0,1]}}", t, m, small));
  small = {};
  small.max_tensors = 1;
  t.clear();
  CHECK(!scanned(kWriter, t, m, small));
}

TEST_CASE("scanner and parser agree on every single-byte change of a writer's header") {
  size_t taken = 0, total = 0;
  for (size_t pos = 0; pos < kWriter.size(); ++pos)
    for (int c = 1; c < 256; ++c) {
      std::string json = kWriter;
      if (json[pos] == char(c)) continue;
      json[pos] = char(c);
      ++total;
      if (agrees(json)) ++taken;
    }
  CHECK(taken > 0);
  CHECK(taken < total);
}
