// The text and number codecs the pickle format borrows from CPython: int() and float() on
// protocol-0 operands, codecs.escape_decode and raw-unicode-escape, UTF-8 with
// 'surrogatepass', and arbitrary-precision integers as two's complement byte strings.
// Internal to the pickle reader and writer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::pickle::detail {

/// A Python int: in `small` when it fits int64, else in `big` as minimal two's complement
/// little-endian bytes (the spelling LONG1 uses and value::text holds).
struct python_int {
  bool is_small = true;
  int64_t small = 0;
  std::string big;
};

enum class int_parse { ok, invalid, too_many_digits, too_large };

/// CPython's int(text, 0) (with_prefixes) or int(text) on bytes: surrounding whitespace,
/// a sign, 0x/0o/0b prefixes, PEP 515 underscores, no leading zeros in base-0 decimals,
/// and CPython's 4300-digit cap on decimal strings. Results longer than max_bytes are
/// refused before they are computed.
int_parse parse_int_literal(std::string_view text, bool with_prefixes, size_t max_bytes,
                            python_int* out);

/// CPython's float() on bytes: decimal literals with underscores, inf/infinity/nan in any
/// case, overflow to +-inf and underflow to 0. No hexadecimal.
bool parse_float_literal(std::string_view text, double* out);

/// codecs.escape_decode (STRING operands). Returns nullptr, or CPython's error message.
const char* escape_decode(std::string_view in, std::string* out);
/// The 'raw-unicode-escape' codec (UNICODE operands), producing UTF-8 in which surrogate
/// code points are encoded like any other (as CPython's str can hold them).
const char* raw_unicode_escape_decode(std::string_view in, std::string* out);

/// UTF-8 as CPython decodes it with errors='strict' or, with allow_surrogates, with
/// errors='surrogatepass' (encoded U+D800..U+DFFF accepted).
bool valid_utf8(std::string_view s, bool allow_surrogates);
/// Whether valid (surrogatepass) UTF-8 contains an encoded surrogate.
bool has_surrogate(std::string_view utf8);
void append_utf8(std::string* out, uint32_t code_point);
/// Decodes one code point of valid (surrogatepass) UTF-8 at s[*i], advancing *i.
uint32_t next_code_point(std::string_view s, size_t* i);
std::string latin1_to_utf8(std::string_view in);
/// False when a code point is above U+00FF (CPython's str.encode('latin1') would fail).
bool utf8_to_latin1(std::string_view in, std::string* out);

/// Drops redundant sign bytes (0x00 above a byte < 0x80, 0xff above a byte >= 0x80).
void minimize_twos(std::string* bytes);
/// Sign-extends bytes of length <= 8; false when they need more than 64 bits.
bool twos_to_int64(std::string_view bytes, int64_t* out);
/// Minimal two's complement, the same bytes CPython's pickle.encode_long writes (0 -> "").
std::string int64_to_twos(int64_t v);
std::string twos_to_decimal(std::string_view bytes);
/// The integer an integral, finite double holds, as minimal two's complement.
std::string integral_double_to_twos(double d);

}  // namespace ckpt::pickle::detail
