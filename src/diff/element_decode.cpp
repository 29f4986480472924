#include "diff/element_decode.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace ckpt::detail {
namespace {

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // every format stores little-endian, as this host does
  return v;
}

enum class special { ieee, fn, fnuz };

// A small float of 1 sign bit, `e` exponent bits and `m` mantissa bits (formats.md §12.2):
// `ieee` has infinities and NaNs at the top exponent; `fn` has no infinities and one NaN
// per sign (all bits set); `fnuz` has no infinities, no negative zero, and one NaN (0x80).
double small_float(uint32_t bits, int e, int m, int bias, special kind) {
  const uint32_t sign = bits >> (e + m) & 1, exponent = bits >> m & ((1u << e) - 1), mantissa = bits & ((1u << m) - 1);
  const uint32_t top = (1u << e) - 1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (kind == special::fnuz && bits == (1u << (e + m))) return nan;
  if (kind == special::ieee && exponent == top)
    return mantissa ? nan : (sign ? -1.0 : 1.0) * std::numeric_limits<double>::infinity();
  if (kind == special::fn && exponent == top && mantissa == (1u << m) - 1) return nan;
  const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), 1 - bias - m)
                                         : std::ldexp(double(mantissa | (1u << m)), int(exponent) - bias - m);
  return sign ? -magnitude : magnitude;
}

}  // namespace

float half_to_float(uint16_t bits) { return float(small_float(bits, 5, 10, 15, special::ieee)); }

float bfloat16_to_float(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;  // bfloat16 is float32's upper half (§12.1)
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

number_kind number_kind_of(dtype t) {
  switch (t) {
    case dtype::boolean:
    case dtype::uint8:
    case dtype::int8:
    case dtype::int16:
    case dtype::int32:
    case dtype::int64:
    case dtype::uint16:
    case dtype::uint32:
    case dtype::uint64: return number_kind::integer;
    case dtype::float16:
    case dtype::bfloat16:
    case dtype::float32:
    case dtype::float64:
    case dtype::float8_e5m2:
    case dtype::float8_e4m3fn:
    case dtype::float8_e5m2fnuz:
    case dtype::float8_e4m3fnuz:
    case dtype::float8_e8m0fnu: return number_kind::real;
    case dtype::complex32:
    case dtype::complex64:
    case dtype::complex128: return number_kind::complex;
    default: return number_kind::none;
  }
}

element_value decode_element(dtype t, const uint8_t* p) {
  switch (t) {
    case dtype::boolean: return {p[0] ? 1.0 : 0.0};  // torch reads any non-zero byte as true
    case dtype::uint8: return {double(p[0])};
    case dtype::int8: return {double(int8_t(p[0]))};
    case dtype::int16: return {double(load<int16_t>(p))};
    case dtype::int32: return {double(load<int32_t>(p))};
    case dtype::int64: return {double(load<int64_t>(p))};
    case dtype::uint16: return {double(load<uint16_t>(p))};
    case dtype::uint32: return {double(load<uint32_t>(p))};
    case dtype::uint64: return {double(load<uint64_t>(p))};
    case dtype::float16: return {half_to_float(load<uint16_t>(p))};
    case dtype::bfloat16: return {bfloat16_to_float(load<uint16_t>(p))};
    case dtype::float32: return {load<float>(p)};
    case dtype::float64: return {load<double>(p)};
    case dtype::float8_e5m2: return {small_float(p[0], 5, 2, 15, special::ieee)};
    case dtype::float8_e4m3fn: return {small_float(p[0], 4, 3, 7, special::fn)};
    case dtype::float8_e5m2fnuz: return {small_float(p[0], 5, 2, 16, special::fnuz)};
    case dtype::float8_e4m3fnuz: return {small_float(p[0], 4, 3, 8, special::fnuz)};
    case dtype::float8_e8m0fnu:  // exponent only, unsigned: 2^(e - 127), all ones NaN (§12.2)
      return {p[0] == 0xff ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, int(p[0]) - 127)};
    case dtype::complex32: return {half_to_float(load<uint16_t>(p)), half_to_float(load<uint16_t>(p + 2))};
    case dtype::complex64: return {load<float>(p), load<float>(p + 4)};
    case dtype::complex128: return {load<double>(p), load<double>(p + 8)};
    default: return {std::numeric_limits<double>::quiet_NaN()};  // number_kind none: never called
  }
}

namespace {
exact_integer signed_integer(int64_t v) {
  // The magnitude of INT64_MIN is 2^63: negated in uint64_t, never in int64_t.
  return v < 0 ? exact_integer{true, 0 - uint64_t(v)} : exact_integer{false, uint64_t(v)};
}
}  // namespace

exact_integer decode_integer(dtype t, const uint8_t* p) {
  switch (t) {
    case dtype::boolean: return {false, p[0] ? 1u : 0u};
    case dtype::uint8: return {false, p[0]};
    case dtype::int8: return signed_integer(int8_t(p[0]));
    case dtype::int16: return signed_integer(load<int16_t>(p));
    case dtype::int32: return signed_integer(load<int32_t>(p));
    case dtype::int64: return signed_integer(load<int64_t>(p));
    case dtype::uint16: return {false, load<uint16_t>(p)};
    case dtype::uint32: return {false, load<uint32_t>(p)};
    case dtype::uint64: return {false, load<uint64_t>(p)};
    default: return {};  // not an integer dtype: never called
  }
}

double integer_distance(const exact_integer& a, const exact_integer& b) {
  if (a.negative == b.negative)
    return double(a.magnitude > b.magnitude ? a.magnitude - b.magnitude : b.magnitude - a.magnitude);
  return double(a.magnitude) + double(b.magnitude);  // opposite signs: past 2^64 only in a double
}

}  // namespace ckpt::detail
