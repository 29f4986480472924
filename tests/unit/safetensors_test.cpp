// ckpt::safetensors::read_header: one case per rule S1-S8 of security.md §2.C with its
// expected error kind, plus the valid shapes of file the reference accepts.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"
#include "base/byteio.h"
#include "ckpt/error.h"
#include "ckpt/safetensors.h"

using ckpt::errc;
namespace st = ckpt::safetensors;

namespace {

std::vector<uint8_t> file_of(const std::string& json, size_t data_bytes) {
  std::vector<uint8_t> out(8 + json.size() + data_bytes);
  ckpt::store_u64(out.data(), json.size());
  for (size_t i = 0; i < json.size(); ++i) out[8 + i] = uint8_t(json[i]);
  for (size_t i = 0; i < data_bytes; ++i) out[8 + json.size() + i] = uint8_t(i);
  return out;
}

st::header parse(const std::vector<uint8_t>& bytes, const st::limits& lim = {}) {
  ckpt::memory_source src(bytes);
  return st::read_header(src, lim);
}

struct failure {
  errc kind;
  std::string message;
  std::optional<uint64_t> offset;
};

failure fail(const std::vector<uint8_t>& bytes, const st::limits& lim = {}) {
  try {
    parse(bytes, lim);
  } catch (const ckpt::error& e) {
    return {e.kind(), e.message(), e.offset()};
  }
  FAIL("header accepted: " << std::string(bytes.begin() + 8, bytes.end()).substr(0, 200));
  return {errc::check_failed, "", std::nullopt};
}

void expect(const std::vector<uint8_t>& bytes, errc kind, const std::string& needle,
            const st::limits& lim = {}) {
  failure f = fail(bytes, lim);
  CHECK_MESSAGE(f.kind == kind, f.message);
  CHECK_MESSAGE(f.message.find(needle) != std::string::npos, f.message);
}

// {"name": {"dtype": D, "shape": S, "data_offsets": [B, E]}}
std::string tensor(const std::string& name, const std::string& dtype, const std::string& shape,
                   uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

}  // namespace

TEST_SUITE("safetensors") {

TEST_CASE("valid file: tensors in JSON order, offsets, metadata") {
  const std::string json = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"}," +
                           tensor("b", "F32", "[2,3]", 8, 32) + "," + tensor("a", "I64", "[1]", 0, 8) +
                           "}";
  const auto bytes = file_of(json, 32);
  ckpt::memory_source src(bytes);
  st::header h = st::read_header(src);
  CHECK(h.header_size == json.size());
  CHECK(h.data_start == 8 + json.size());
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "b");
  CHECK(h.tensors[0].type == ckpt::dtype::float32);
  CHECK(h.tensors[0].shape == std::vector<int64_t>{2, 3});
  CHECK(h.tensors[0].begin == 8);
  CHECK(h.tensors[0].end == 32);
  CHECK(h.tensors[0].file_offset == 8 + json.size() + 8);
  CHECK(h.tensors[1].type == ckpt::dtype::int64);
  CHECK(h.tensors[1].file_offset == h.data_start);
  REQUIRE(h.metadata.size() == 2);
  CHECK(h.metadata[0] == std::pair<std::string, std::string>{"format", "pt"});
  CHECK(h.metadata[1].first == "note");
  CHECK(src.bytes_read() == 8 + json.size());  // the data buffer is never read
}

TEST_CASE("valid edge cases") {
  SUBCASE("scalar") {
    auto h = parse(file_of("{" + tensor("s", "F32", "[]", 0, 4) + "}", 4));
    CHECK(h.tensors[0].shape.empty());
  }
  SUBCASE("empty tensors share an offset") {
    auto h = parse(file_of("{" + tensor("e", "F16", "[0,3]", 0, 0) + "," + tensor("f", "F32", "[4,0]", 0, 0) +
                           "," + tensor("g", "U8", "[2]", 0, 2) + "}",
                           2));
    CHECK(h.tensors[0].shape == std::vector<int64_t>{0, 3});
  }
  SUBCASE("no tensors at all") { CHECK(parse(file_of("{}", 0)).tensors.empty()); }
  SUBCASE("metadata only") { CHECK(parse(file_of("{\"__metadata__\":{}}", 0)).metadata.empty()); }
  SUBCASE("leading and trailing whitespace (writers pad the header)") {
    auto h = parse(file_of(" \n\t{" + tensor("x", "BF16", "[3]", 0, 6) + "}     \r\n ", 6));
    CHECK(h.tensors[0].type == ckpt::dtype::bfloat16);
  }
  SUBCASE("F4 packs pairs: torch's last dimension is halved") {
    auto h = parse(file_of("{" + tensor("q", "F4", "[3,8]", 0, 12) + "}", 12));
    CHECK(h.tensors[0].type == ckpt::dtype::float4_e2m1fn_x2);
    CHECK(h.tensors[0].shape == std::vector<int64_t>{3, 4});
  }
  SUBCASE("float8 and unsigned dtypes") {
    auto h = parse(file_of("{" + tensor("a", "F8_E4M3", "[2]", 0, 2) + "," + tensor("b", "F8_E8M0", "[1]", 2, 3) +
                           "," + tensor("c", "U16", "[1]", 3, 5) + "," + tensor("d", "C64", "[1]", 5, 13) + "}",
                           13));
    CHECK(h.tensors[0].type == ckpt::dtype::float8_e4m3fn);
    CHECK(h.tensors[1].type == ckpt::dtype::float8_e8m0fnu);
    CHECK(h.tensors[2].type == ckpt::dtype::uint16);
    CHECK(h.tensors[3].type == ckpt::dtype::complex64);
  }
  SUBCASE("escaped and non-ASCII names") {
    auto h = parse(file_of("{\"a\\\"b\\u00e9\\n\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1));
    CHECK(h.tensors[0].name == "a\"b\xc3\xa9\n");
  }
  SUBCASE("fields in any order") {
    auto h = parse(file_of("{\"x\":{\"data_offsets\":[0,2],\"shape\":[1],\"dtype\":\"I16\"}}", 2));
    CHECK(h.tensors[0].type == ckpt::dtype::int16);
  }
}

TEST_CASE("S1 header length") {
  expect(std::vector<uint8_t>{1, 2, 3}, errc::corrupt, "too few");
  SUBCASE("over 100,000,000") {
    std::vector<uint8_t> b(16, ' ');
    ckpt::store_u64(b.data(), 100'000'001);
    expect(b, errc::corrupt, "exceeds the format's maximum");
  }
  SUBCASE("past the end of the file") {
    auto b = file_of("{}", 0);
    ckpt::store_u64(b.data(), 3);
    expect(b, errc::corrupt, "runs past the end of the file");
    ckpt::store_u64(b.data(), ~0ull);
    expect(b, errc::corrupt, "exceeds");
  }
}

TEST_CASE("S2 header text is strict JSON") {
  expect(file_of("{\"a\":}", 0), errc::corrupt, "not valid JSON");
  expect(file_of("{\"__metadata__\":{\"a\":\"b\",}}", 0), errc::corrupt, "not valid JSON");
  expect(file_of("{/* c */}", 0), errc::corrupt, "not valid JSON");
  expect(file_of("{\"__metadata__\":{\"a\":NaN}}", 0), errc::corrupt, "not valid JSON");
  expect(file_of("{} x", 0), errc::corrupt, "not valid JSON");
  expect(file_of(std::string("{}\0", 3), 0), errc::corrupt, "NUL byte");
  expect(file_of(std::string("{\0}", 3), 0), errc::corrupt, "NUL byte");
  expect(file_of("{\"\xff\":1}", 0), errc::corrupt, "not valid JSON");
  expect(file_of("{\"\xc0\xaf\":1}", 0), errc::corrupt, "not valid JSON");
  expect(file_of("\xef\xbb\xbf{}", 0), errc::corrupt, "byte order mark");
  expect(file_of("", 0), errc::corrupt, "not valid JSON");
  expect(file_of("[]", 0), errc::corrupt, "not a JSON object");
  expect(file_of("\"x\"", 0), errc::corrupt, "not a JSON object");
  SUBCASE("the error offset points into the header") {
    failure f = fail(file_of("{\"a\" 1}", 0));
    CHECK(f.offset == uint64_t(8 + 5));
  }
  SUBCASE("deep nesting is refused at the first level the schema does not allow") {
    std::string deep = "{\"a\":{\"shape\":" + std::string(100000, '[') + std::string(100000, ']') + "}}";
    expect(file_of(deep, 0), errc::corrupt, "shape of tensor 'a' contains an array");
  }
}

TEST_CASE("S3 duplicate keys at every level") {
  expect(file_of("{" + tensor("a", "U8", "[1]", 0, 1) + "," + tensor("a", "U8", "[1]", 1, 2) + "}", 2),
         errc::corrupt, "duplicate key 'a'");
  expect(file_of("{\"__metadata__\":{},\"__metadata__\":{}}", 0), errc::corrupt, "duplicate key '__metadata__'");
  expect(file_of("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0), errc::corrupt,
         "duplicate __metadata__ key 'k'");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
         errc::corrupt, "duplicate field 'dtype'");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"shape\":[1]}}", 1),
         errc::corrupt, "duplicate field 'shape'");
  SUBCASE("twin: same names in different objects are fine") {
    parse(file_of("{\"__metadata__\":{\"dtype\":\"x\"},\"dtype\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}",
                  1));
  }
}

TEST_CASE("S4 __metadata__ is string to string") {
  expect(file_of("{\"__metadata__\":{\"a\":1}}", 0), errc::corrupt, "__metadata__ value for 'a' is a number");
  expect(file_of("{\"__metadata__\":{\"a\":{}}}", 0), errc::corrupt, "is an object");
  expect(file_of("{\"__metadata__\":{\"a\":null}}", 0), errc::corrupt, "is null");
  expect(file_of("{\"__metadata__\":{\"a\":[\"x\"]}}", 0), errc::corrupt, "is an array");
  expect(file_of("{\"__metadata__\":\"x\"}", 0), errc::corrupt, "__metadata__ is a string, not an object");
  expect(file_of("{\"__metadata__\":null}", 0), errc::corrupt, "__metadata__ is null");
}

TEST_CASE("tensor objects have exactly dtype, shape, data_offsets") {
  // The reference skips it; ckptool does not read what it cannot vouch for.
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1), errc::unsupported,
         "a field this reader does not know, 'x'");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 0), errc::corrupt, "has no data_offsets");
  expect(file_of("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1), errc::corrupt, "has no dtype");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1), errc::corrupt, "has no shape");
  expect(file_of("{\"a\":[1]}", 0), errc::corrupt, "tensor 'a' is an array, not an object");
  expect(file_of("{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1), errc::corrupt,
         "dtype of tensor 'a' is a number, not a string");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1), errc::corrupt,
         "shape of tensor 'a' is a number, not an array");
}

TEST_CASE("S5 offsets tile the data buffer") {
  const std::string a = tensor("a", "U8", "[4]", 0, 4);
  SUBCASE("twin") { parse(file_of("{" + a + "," + tensor("b", "U8", "[4]", 4, 8) + "}", 8)); }
  expect(file_of("{" + a + "," + tensor("b", "U8", "[4]", 6, 10) + "}", 10), errc::corrupt,
         "2 unused bytes before tensor 'b'");
  expect(file_of("{" + a + "," + tensor("b", "U8", "[4]", 2, 6) + "}", 6), errc::corrupt, "overlaps");
  expect(file_of("{" + tensor("a", "U8", "[0]", 4, 0) + "}", 0), errc::corrupt, "end before they begin");
  expect(file_of("{" + a + "}", 5), errc::corrupt, "1 bytes after the last tensor");
  expect(file_of("{" + a + "}", 3), errc::corrupt, "the file has 3");
  expect(file_of("{" + tensor("a", "U8", "[4]", 2, 6) + "}", 6), errc::corrupt, "2 unused bytes before tensor 'a'");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 0), errc::corrupt,
         "negative value");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1), errc::corrupt,
         "has value 1.0, not a non-negative integer");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1e0]}}", 1), errc::corrupt,
         "not a non-negative integer");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2), errc::corrupt,
         "more than two values");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]}}", 1), errc::corrupt,
         "has 1 values, not two");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 1),
         errc::corrupt, "not a non-negative integer");
  expect(file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", 1), errc::corrupt,
         "contains a string");
}

TEST_CASE("S6 size arithmetic") {
  expect(file_of("{" + tensor("a", "U8", "[2,18446744073709551614]", 0, 0) + "}", 0), errc::corrupt, "overflows");
  expect(file_of("{" + tensor("a", "U8", "[2,9223372036854775807]", 0, 0) + "}", 0), errc::corrupt, "overflows");
  expect(file_of("{" + tensor("a", "F32", "[2,9223372036854775807]", 0, 0) + "}", 0), errc::corrupt, "overflows");
  expect(file_of("{" + tensor("a", "U8", "[18446744073709551615,2]", 0, 0) + "}", 0), errc::corrupt, "overflows");
  expect(file_of("{" + tensor("a", "F32", "[2,3]", 0, 23) + "}", 23), errc::corrupt, "spans 23 bytes but F32 [2, 3] needs 24");
  expect(file_of("{" + tensor("a", "F4", "[3]", 0, 1) + "}", 1), errc::corrupt, "does not fill whole bytes");
  expect(file_of("{" + tensor("a", "F32", "[2,-3]", 0, 0) + "}", 0), errc::corrupt, "negative value -3");
  expect(file_of("{" + tensor("a", "F32", "[2,3.0]", 0, 24) + "}", 24), errc::corrupt, "not a non-negative integer");
  SUBCASE("F4 with an odd last dimension is valid safetensors that torch cannot hold") {
    expect(file_of("{" + tensor("a", "F4", "[2,3]", 0, 3) + "}", 3), errc::unsupported, "in pairs");
  }
  SUBCASE("a huge dimension beside a zero is valid but not a torch size") {
    expect(file_of("{" + tensor("a", "U8", "[0,18446744073709551615]", 0, 0) + "}", 0), errc::unsupported,
           "too large for torch");
  }
}

TEST_CASE("S7 dtypes") {
  expect(file_of("{" + tensor("a", "F31", "[1]", 0, 4) + "}", 4), errc::corrupt, "unknown dtype 'F31'");
  expect(file_of("{" + tensor("a", "f32", "[1]", 0, 4) + "}", 4), errc::corrupt, "unknown dtype");
  expect(file_of("{" + tensor("a", "F6_E2M3", "[4]", 0, 3) + "}", 3), errc::unsupported, "F6_E2M3");
  expect(file_of("{" + tensor("a", "F6_E3M2", "[4]", 0, 3) + "}", 3), errc::unsupported, "F6_E3M2");
  SUBCASE("F6 size rules still apply") {
    expect(file_of("{" + tensor("a", "F6_E2M3", "[3]", 0, 3) + "}", 3), errc::corrupt, "whole bytes");
  }
}

TEST_CASE("S8 limits") {
  st::limits lim;
  lim.max_tensors = 2;
  const std::string three = "{" + tensor("a", "U8", "[1]", 0, 1) + "," + tensor("b", "U8", "[1]", 1, 2) + "," +
                            tensor("c", "U8", "[1]", 2, 3) + "}";
  parse(file_of(three, 3));
  expect(file_of(three, 3), errc::limit, "more than 2 tensors", lim);
  st::limits names;
  names.max_name_length = 3;
  parse(file_of("{" + tensor("abc", "U8", "[1]", 0, 1) + "}", 1), names);
  expect(file_of("{" + tensor("abcd", "U8", "[1]", 0, 1) + "}", 1), errc::limit, "longer than 3", names);
  st::limits rank;
  rank.max_rank = 2;
  parse(file_of("{" + tensor("a", "U8", "[1,1]", 0, 1) + "}", 1), rank);
  expect(file_of("{" + tensor("a", "U8", "[1,1,1]", 0, 1) + "}", 1), errc::limit, "more than 2 dimensions", rank);
}

TEST_CASE("errors name the file") {
  const auto bytes = file_of("{\"a\":1", 0);
  ckpt::memory_source src(bytes, "model.safetensors");
  try {
    st::read_header(src);
    FAIL("accepted");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()).rfind("model.safetensors: byte ", 0) == 0);
  }
}

TEST_CASE("every single-byte corruption is either read or refused with ckpt::error") {
  const auto good = file_of("{\"__metadata__\":{\"format\":\"pt\"}," + tensor("w", "F32", "[2,2]", 0, 16) + "," +
                                tensor("b", "F4", "[2]", 16, 17) + "}  ",
                            17);
  size_t accepted = 0;
  for (size_t pos = 0; pos < good.size(); ++pos) {
    for (uint8_t flip : {uint8_t(0x01), uint8_t(0x20), uint8_t(0x80), uint8_t(0xFF)}) {
      auto bytes = good;
      bytes[pos] ^= flip;
      try {
        parse(bytes);
        ++accepted;
      } catch (const ckpt::error&) {
      }
    }
  }
  CHECK(accepted > 0);  // data bytes, whitespace and name characters may change freely
}

TEST_CASE("looks_like_safetensors") {
  auto good = file_of("{" + tensor("a", "U8", "[1]", 0, 1) + "}", 1);
  CHECK(st::looks_like_safetensors(good.data(), good.size(), good.size()));
  CHECK(st::looks_like_safetensors(good.data(), 16, good.size()));
  auto padded = file_of("  {}", 0);
  CHECK(st::looks_like_safetensors(padded.data(), padded.size(), padded.size()));
  // A zip local header: byte 8 is the compression method's low byte, never '{'.
  auto zip = std::vector<uint8_t>{'P', 'K', 3, 4, 20, 0, 0, 8, 8, 0, 0};
  CHECK_FALSE(st::looks_like_safetensors(zip.data(), zip.size(), 1 << 20));
  // An impossible N in front of a JSON object is a broken safetensors file, so that
  // read_header can name the bad length; in front of anything else it is not one.
  CHECK(st::looks_like_safetensors(good.data(), good.size(), 10));
  auto huge = good;
  huge[7] = 0x40;  // N = 2^62
  CHECK(st::looks_like_safetensors(huge.data(), huge.size(), huge.size()));
  huge[8] = 'x';
  CHECK_FALSE(st::looks_like_safetensors(huge.data(), huge.size(), huge.size()));
  CHECK_FALSE(st::looks_like_safetensors(good.data(), 8, good.size()));   // too little to tell
  auto pickle = std::vector<uint8_t>{0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20};
  CHECK_FALSE(st::looks_like_safetensors(pickle.data(), pickle.size(), 1 << 20));
}

}  // TEST_SUITE
