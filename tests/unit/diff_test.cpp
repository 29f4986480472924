// ckpt::diff_checkpoints over safetensors files built in memory: window edges, the verdicts
// of formats.md §12.3, --metadata-only reading no tensor byte; and element decoding of the
// special values of each small float (formats.md §12.2). Every bit pattern is checked
// against torch itself in tests/py/test_diff.py.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/byteio.h"
#include "ckpt/byte_source.h"
#include "ckpt/checkpoint.h"
#include "ckpt/diff.h"
#include "diff/element_decode.h"

using ckpt::dtype;
using ckpt::detail::decode_element;

namespace {

// One F32 tensor "t" of the given values, as save_file lays it out.
ckpt::checkpoint f32_file(const std::vector<float>& values, const std::string& name) {
  const std::string json = "{\"t\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(values.size()) +
                           "],\"data_offsets\":[0," + std::to_string(values.size() * 4) + "]}}";
  std::vector<uint8_t> bytes(8 + json.size() + values.size() * 4);
  ckpt::store_u64(bytes.data(), json.size());
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  std::memcpy(bytes.data() + 8 + json.size(), values.data(), values.size() * 4);
  ckpt::checkpoint c = ckpt::open_checkpoint(std::make_unique<ckpt::memory_source>(std::move(bytes), name));
  c.path = name;
  return c;
}

double decode(dtype t, uint32_t bits) {
  uint8_t b[4];
  std::memcpy(b, &bits, sizeof b);
  return decode_element(t, b).re;
}

}  // namespace

TEST_CASE("small floats decode their special values as c10 defines them") {
  CHECK(decode(dtype::float16, 0x3c00) == 1.0);
  CHECK(decode(dtype::float16, 0x0001) == std::ldexp(1.0, -24));
  CHECK(decode(dtype::float16, 0xfc00) == -INFINITY);
  CHECK(std::isnan(decode(dtype::float16, 0x7e01)));
  CHECK(decode(dtype::bfloat16, 0x3f80) == 1.0);
  CHECK(decode(dtype::bfloat16, 0xc2f7) == -123.5);
  CHECK(decode(dtype::float8_e4m3fn, 0x7e) == 448.0);
  CHECK(std::isnan(decode(dtype::float8_e4m3fn, 0x7f)));
  CHECK(std::isnan(decode(dtype::float8_e4m3fn, 0xff)));
  CHECK(decode(dtype::float8_e4m3fn, 0x01) == std::ldexp(1.0, -9));
  CHECK(decode(dtype::float8_e5m2, 0x7b) == 57344.0);
  CHECK(decode(dtype::float8_e5m2, 0x7c) == INFINITY);
  CHECK(std::isnan(decode(dtype::float8_e5m2, 0x7d)));
  CHECK(std::isnan(decode(dtype::float8_e5m2fnuz, 0x80)));
  CHECK(decode(dtype::float8_e5m2fnuz, 0x7f) == 57344.0);
  CHECK(std::isnan(decode(dtype::float8_e4m3fnuz, 0x80)));
  CHECK(decode(dtype::float8_e4m3fnuz, 0x7f) == 240.0);
  CHECK(decode(dtype::float8_e4m3fnuz, 0xff) == -240.0);
  CHECK(decode(dtype::float8_e8m0fnu, 0x7f) == 1.0);
  CHECK(decode(dtype::float8_e8m0fnu, 0x00) == std::ldexp(1.0, -127));
  CHECK(std::isnan(decode(dtype::float8_e8m0fnu, 0xff)));
  CHECK(decode(dtype::int16, 0x8000) == -32768.0);
  CHECK(decode(dtype::boolean, 0x02) == 1.0);  // any non-zero byte is True
}

TEST_CASE("a difference in the last element is found whatever the window") {
  std::vector<float> a(10), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
  b = a;
  b[9] += 0.25f;
  const ckpt::checkpoint ca = f32_file(a, "a"), cb = f32_file(b, "b");
  for (uint64_t window : {1, 4, 12, 40, 1 << 20}) {
    CAPTURE(window);
    ckpt::diff_options o;
    o.window_bytes = window;
    const ckpt::diff_report r = ckpt::diff_checkpoints(ca, cb, o);
    REQUIRE(r.tensors.size() == 1);
    const ckpt::tensor_diff& t = r.tensors[0];
    CHECK(t.values == ckpt::value_verdict::different);
    CHECK(t.outside == 1);
    CHECK(t.first_outside == 9);
    CHECK(t.max_abs_error == 0.25);
    CHECK(r.bytes_compared == 80);
    CHECK_FALSE(r.equivalent());
  }
}

TEST_CASE("verdicts: identical, equal, close, different") {
  const ckpt::checkpoint base = f32_file({0.0f, 1.0f, 2.0f}, "a");
  ckpt::diff_options exact;
  CHECK(ckpt::diff_checkpoints(base, f32_file({0.0f, 1.0f, 2.0f}, "b"), exact).tensors[0].values ==
        ckpt::value_verdict::identical);
  const ckpt::diff_report negative_zero = ckpt::diff_checkpoints(base, f32_file({-0.0f, 1.0f, 2.0f}, "b"), exact);
  CHECK(negative_zero.tensors[0].values == ckpt::value_verdict::equal);
  CHECK(negative_zero.tensors[0].bits_differ == 1);
  CHECK(negative_zero.equivalent());
  ckpt::diff_options loose;
  loose.atol = 0.5;
  const ckpt::checkpoint near = f32_file({0.0f, 1.5f, 2.0f}, "b");
  CHECK(ckpt::diff_checkpoints(base, near, loose).tensors[0].values == ckpt::value_verdict::close);
  CHECK(ckpt::diff_checkpoints(base, near, exact).tensors[0].values == ckpt::value_verdict::different);
}

TEST_CASE("--metadata-only reads no tensor byte") {
  const ckpt::checkpoint a = f32_file({1.0f, 2.0f}, "a"), b = f32_file({1.0f, 3.0f}, "b");
  const uint64_t before = a.files[0].source->bytes_read() + b.files[0].source->bytes_read();
  ckpt::diff_options o;
  o.metadata_only = true;
  const ckpt::diff_report r = ckpt::diff_checkpoints(a, b, o);
  CHECK(r.equivalent());
  CHECK(r.bytes_compared == 0);
  CHECK(a.files[0].source->bytes_read() + b.files[0].source->bytes_read() == before);
  o.metadata_only = false;
  CHECK_FALSE(ckpt::diff_checkpoints(a, b, o).equivalent());
}
