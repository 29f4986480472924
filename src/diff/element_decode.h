// Internal: tensor elements as numbers, in the core library (no LibTorch), for diff's
// comparisons. Each dtype's bit layout is docs/formats.md §12; the unit and Python tests
// check every float16, bfloat16 and float8 bit pattern against torch's own conversion.
#pragma once

#include <cstdint>

#include "ckpt/dtype.h"

namespace ckpt::detail {

/// How diff reads a dtype's elements.
enum class number_kind {
  none,     // bytes only: packed float4, quantized and bits dtypes have no plain value
  integer,  // bool, signed and unsigned integers
  real,     // floating point
  complex,  // two floating-point parts, real first
};
number_kind number_kind_of(dtype t);

struct element_value {
  double re = 0;
  double im = 0;  // 0 unless complex
};

/// The element of dtype `t` (little-endian, as every format ckptool reads stores it) at `p`.
/// Exact for every dtype but the 64-bit integers, whose values above 2^53 round (exact:
/// decode_integer).
/// Precondition: number_kind_of(t) != none.
element_value decode_element(dtype t, const uint8_t* p);

/// An integer element exactly: int64 and uint64 differ above 2^53, where their doubles
/// no longer do. Zero is never negative.
struct exact_integer {
  bool negative = false;
  uint64_t magnitude = 0;
  bool operator==(const exact_integer& o) const { return negative == o.negative && magnitude == o.magnitude; }
};

/// The element of integer dtype `t` (bool as 0 or 1) at `p`.
/// Precondition: number_kind_of(t) == integer.
exact_integer decode_integer(dtype t, const uint8_t* p);

/// |a - b| as a double: exact up to 2^53, rounded above (a difference of 1 stays 1).
double integer_distance(const exact_integer& a, const exact_integer& b);

/// float16 / bfloat16 bits as a float (exact).
float half_to_float(uint16_t bits);
float bfloat16_to_float(uint16_t bits);

}  // namespace ckpt::detail
