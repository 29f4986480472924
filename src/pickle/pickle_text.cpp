#include "pickle/pickle_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ckpt::pickle::detail {
namespace {

// CPython's sys.int_info.default_max_str_digits: int() refuses longer decimal strings,
// which also keeps our quadratic decimal conversion cheap.
constexpr size_t kMaxDecimalDigits = 4300;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view strip(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'z') return c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return 99;
}

bool is_hex(char c) { return digit_value(c) < 16; }

// Magnitudes as little-endian 32-bit limbs.
using limbs = std::vector<uint32_t>;

void mul_add(limbs* m, uint32_t mul, uint32_t add) {
  uint64_t carry = add;
  for (uint32_t& limb : *m) {
    uint64_t t = uint64_t(limb) * mul + carry;
    limb = uint32_t(t);
    carry = t >> 32;
  }
  if (carry) m->push_back(uint32_t(carry));
}

// Two's complement bytes of sign * magnitude.
std::string magnitude_to_twos(const limbs& m, bool negative) {
  std::string out;
  out.reserve(m.size() * 4 + 1);
  for (uint32_t limb : m)
    for (int i = 0; i < 4; ++i) out.push_back(char(uint8_t(limb >> (8 * i))));
  out.push_back('\0');
  if (negative) {
    unsigned carry = 1;
    for (char& c : out) {
      unsigned t = uint8_t(~uint8_t(c)) + carry;
      c = char(uint8_t(t));
      carry = t >> 8;
    }
  }
  minimize_twos(&out);
  return out;
}

void set_result(const limbs& m, bool negative, python_int* out) {
  std::string twos = magnitude_to_twos(m, negative);
  int64_t small = 0;
  if (twos_to_int64(twos, &small)) {
    out->is_small = true;
    out->small = small;
    out->big.clear();
  } else {
    out->is_small = false;
    out->big = std::move(twos);
  }
}

}  // namespace

int_parse parse_int_literal(std::string_view text, bool with_prefixes, size_t max_bytes,
                            python_int* out) {
  std::string_view s = strip(text);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  int base = 10;
  bool after_prefix = false;
  if (with_prefixes && s.size() >= 2 && s[0] == '0') {
    char p = char(s[1] | 0x20);
    if (p == 'x' || p == 'o' || p == 'b') {
      base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
      s.remove_prefix(2);
      after_prefix = true;
    }
  }
  // PEP 515: one underscore between digits, or directly after a base prefix.
  std::string digits;
  digits.reserve(s.size());
  bool last_was_digit = after_prefix;
  for (char c : s) {
    if (c == '_') {
      if (!last_was_digit) return int_parse::invalid;
      last_was_digit = false;
      continue;
    }
    if (digit_value(c) >= base) return int_parse::invalid;
    digits.push_back(c);
    last_was_digit = true;
  }
  if (digits.empty() || !last_was_digit) return int_parse::invalid;
  // int("010", 0) is an error in Python 3 (it would have been octal in Python 2).
  if (with_prefixes && base == 10 && digits[0] == '0' &&
      digits.find_first_not_of('0') != std::string::npos)
    return int_parse::invalid;
  if (base == 10 && digits.size() > kMaxDecimalDigits) return int_parse::too_many_digits;

  size_t first = std::min(digits.find_first_not_of('0'), digits.size());
  size_t significant = digits.size() - first;
  // Bits per digit rounded up; the +1 byte is the sign byte two's complement may need.
  double bits_per_digit = base == 16 ? 4 : base == 8 ? 3 : base == 2 ? 1 : 3.3219280948873626;
  if (double(significant) * bits_per_digit / 8 > double(max_bytes) + 1) return int_parse::too_large;

  limbs m;
  if (base == 10) {
    size_t i = first;
    size_t head = significant % 9;
    if (head == 0 && significant) head = 9;
    while (i < digits.size()) {
      size_t take = (i == first) ? head : 9;
      uint32_t chunk = 0, scale = 1;
      for (size_t k = 0; k < take; ++k) {
        chunk = chunk * 10 + uint32_t(digits[i + k] - '0');
        scale *= 10;
      }
      mul_add(&m, scale, chunk);
      i += take;
    }
  } else {
    int shift = base == 16 ? 4 : base == 8 ? 3 : 1;
    size_t total_bits = significant * size_t(shift);
    m.assign((total_bits + 31) / 32, 0);
    size_t bit = 0;
    for (size_t k = digits.size(); k-- > first;) {
      uint32_t d = uint32_t(digit_value(digits[k]));
      for (int b = 0; b < shift; ++b, ++bit)
        if (d & (1u << b)) m[bit / 32] |= 1u << (bit % 32);
    }
  }
  while (!m.empty() && m.back() == 0) m.pop_back();
  set_result(m, negative && !m.empty(), out);
  if (!out->is_small && out->big.size() > max_bytes) return int_parse::too_large;
  return int_parse::ok;
}

bool parse_float_literal(std::string_view text, double* out) {
  std::string_view s = strip(text);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  auto iequals = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (char(a[i] | 0x20) != b[i]) return false;
    return true;
  };
  if (iequals(s, "inf") || iequals(s, "infinity")) {
    *out = negative ? -HUGE_VAL : HUGE_VAL;
    return true;
  }
  if (iequals(s, "nan")) {
    *out = negative ? -std::numeric_limits<double>::quiet_NaN()
                    : std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  // digitpart: digit (["_"] digit)*; number: digitpart ["." [digitpart]] | "." digitpart;
  // then an optional exponent ("e" ["+"|"-"] digitpart).
  std::string clean;
  clean.reserve(s.size());
  size_t i = 0;
  auto digitpart = [&]() {
    size_t start = clean.size();
    while (i < s.size()) {
      if (s[i] >= '0' && s[i] <= '9') {
        clean.push_back(s[i++]);
      } else if (s[i] == '_' && clean.size() > start && i + 1 < s.size() && s[i + 1] >= '0' &&
                 s[i + 1] <= '9') {
        ++i;
      } else {
        break;
      }
    }
    return clean.size() > start;
  };
  bool int_digits = digitpart();
  bool frac_digits = false;
  if (i < s.size() && s[i] == '.') {
    clean.push_back(s[i++]);
    frac_digits = digitpart();
  }
  if (!int_digits && !frac_digits) return false;
  long exponent = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    clean.push_back('e');
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
    size_t exp_start = clean.size();
    if (!digitpart()) return false;
    for (size_t k = exp_start; k < clean.size() && exponent < 100000; ++k)
      exponent = exponent * 10 + (clean[k] - '0');
    if (clean[exp_start - 1] == '-') exponent = -exponent;
  }
  if (i != s.size()) return false;
  double v = 0;
  auto res =
      std::from_chars(clean.data(), clean.data() + clean.size(), v, std::chars_format::general);
  if (res.ptr != clean.data() + clean.size()) return false;
  if (res.ec == std::errc::result_out_of_range) {
    // from_chars leaves v alone here. Decide between overflow and underflow from the
    // decimal position of the leading significant digit.
    long lead = 0;
    size_t dot = clean.find('.');
    size_t mantissa_end = clean.find('e');
    if (mantissa_end == std::string::npos) mantissa_end = clean.size();
    size_t int_end = dot == std::string::npos ? mantissa_end : dot;
    size_t nz = clean.find_first_not_of("0.");
    if (nz == std::string::npos || nz >= mantissa_end) {
      v = 0;
    } else {
      lead = nz < int_end ? long(int_end - nz) : -long(nz - int_end) + 1;
      v = lead + exponent > 0 ? HUGE_VAL : 0.0;
    }
  } else if (res.ec != std::errc()) {
    return false;
  }
  *out = negative ? -v : v;
  return true;
}

const char* escape_decode(std::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size();) {
    char c = in[i++];
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (i == in.size()) return "Trailing \\ in string";
    c = in[i++];
    switch (c) {
      case '\n':
        break;
      case '\\':
        out->push_back('\\');
        break;
      case '\'':
        out->push_back('\'');
        break;
      case '"':
        out->push_back('"');
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 'v':
        out->push_back('\v');
        break;
      case 'a':
        out->push_back('\a');
        break;
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7': {
        unsigned v = unsigned(c - '0');
        for (int k = 0; k < 2 && i < in.size() && in[i] >= '0' && in[i] <= '7'; ++k)
          v = v * 8 + unsigned(in[i++] - '0');
        out->push_back(char(uint8_t(v)));  // CPython keeps the low byte of \400..\777
        break;
      }
      case 'x':
        if (i + 1 < in.size() && is_hex(in[i]) && is_hex(in[i + 1])) {
          out->push_back(char(digit_value(in[i]) * 16 + digit_value(in[i + 1])));
          i += 2;
          break;
        }
        return "invalid \\x escape";
      default:
        out->push_back('\\');
        out->push_back(c);
        break;
    }
  }
  return nullptr;
}

const char* raw_unicode_escape_decode(std::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size();) {
    uint8_t c = uint8_t(in[i]);
    if (c != '\\') {
      append_utf8(out, c);
      ++i;
      continue;
    }
    // A \u escape counts only after an odd number of backslashes.
    size_t run = 0;
    while (i < in.size() && in[i] == '\\') {
      out->push_back('\\');
      ++run;
      ++i;
    }
    if (run % 2 == 0 || i == in.size() || (in[i] != 'u' && in[i] != 'U')) continue;
    out->pop_back();
    int count = in[i] == 'u' ? 4 : 8;
    ++i;
    uint32_t cp = 0;
    for (int k = 0; k < count; ++k, ++i) {
      if (i == in.size() || !is_hex(in[i]))
        return count == 4 ? "truncated \\uXXXX escape" : "truncated \\UXXXXXXXX escape";
      cp = cp * 16 + uint32_t(digit_value(in[i]));
    }
    if (cp > 0x10FFFF) return "\\Uxxxxxxxx out of range";
    append_utf8(out, cp);
  }
  return nullptr;
}

bool valid_utf8(std::string_view s, bool allow_surrogates) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // Most pickled strings are ASCII: skip eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(1)) return false;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(1) || !cont(2)) return false;
      uint8_t c1 = p[i + 1];
      if (c == 0xE0 && c1 < 0xA0) return false;                        // overlong
      if (c == 0xED && c1 >= 0xA0 && !allow_surrogates) return false;  // surrogate
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(1) || !cont(2) || !cont(3)) return false;
      uint8_t c1 = p[i + 1];
      if (c == 0xF0 && c1 < 0x90) return false;   // overlong
      if (c == 0xF4 && c1 >= 0x90) return false;  // above U+10FFFF
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

bool has_surrogate(std::string_view utf8) {
  for (size_t i = 0; i + 1 < utf8.size(); ++i)
    if (uint8_t(utf8[i]) == 0xED && uint8_t(utf8[i + 1]) >= 0xA0) return true;
  return false;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

uint32_t next_code_point(std::string_view s, size_t* i) {
  auto at = [&](size_t k) { return uint32_t(uint8_t(s[*i + k])); };
  uint32_t c = at(0);
  if (c < 0x80) {
    *i += 1;
    return c;
  }
  if (c < 0xE0) {
    uint32_t cp = ((c & 0x1F) << 6) | (at(1) & 0x3F);
    *i += 2;
    return cp;
  }
  if (c < 0xF0) {
    uint32_t cp = ((c & 0x0F) << 12) | ((at(1) & 0x3F) << 6) | (at(2) & 0x3F);
    *i += 3;
    return cp;
  }
  uint32_t cp =
      ((c & 0x07) << 18) | ((at(1) & 0x3F) << 12) | ((at(2) & 0x3F) << 6) | (at(3) & 0x3F);
  *i += 4;
  return cp;
}

std::string latin1_to_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) append_utf8(&out, uint8_t(c));
  return out;
}

bool utf8_to_latin1(std::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size();) {
    uint32_t cp = next_code_point(in, &i);
    if (cp > 0xFF) return false;
    out->push_back(char(cp));
  }
  return true;
}

void minimize_twos(std::string* bytes) {
  std::string& b = *bytes;
  while (b.size() >= 2) {
    uint8_t top = uint8_t(b.back()), below = uint8_t(b[b.size() - 2]);
    if ((top == 0x00 && below < 0x80) || (top == 0xFF && below >= 0x80))
      b.pop_back();
    else
      break;
  }
  if (b.size() == 1 && b[0] == '\0') b.clear();
}

bool twos_to_int64(std::string_view bytes, int64_t* out) {
  if (bytes.size() > 8) {
    // Longer strings may still be a non-minimal spelling of a small value.
    std::string copy(bytes);
    minimize_twos(&copy);
    if (copy.size() > 8) return false;
    return twos_to_int64(copy, out);
  }
  if (bytes.empty()) {
    *out = 0;
    return true;
  }
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) v |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  if (bytes.size() < 8 && (uint8_t(bytes.back()) & 0x80)) v |= ~uint64_t(0) << (8 * bytes.size());
  *out = int64_t(v);
  return true;
}

std::string int64_to_twos(int64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(uint64_t(v) >> (8 * i)));
  minimize_twos(&out);
  return out;
}

std::string twos_to_decimal(std::string_view bytes) {
  if (bytes.empty()) return "0";
  bool negative = uint8_t(bytes.back()) & 0x80;
  std::string mag(bytes);
  if (negative) {
    unsigned carry = 1;
    for (char& c : mag) {
      unsigned t = uint8_t(~uint8_t(c)) + carry;
      c = char(uint8_t(t));
      carry = t >> 8;
    }
  }
  limbs m((mag.size() + 3) / 4, 0);
  for (size_t i = 0; i < mag.size(); ++i) m[i / 4] |= uint32_t(uint8_t(mag[i])) << (8 * (i % 4));
  while (!m.empty() && m.back() == 0) m.pop_back();
  std::string digits;
  while (!m.empty()) {
    uint64_t rem = 0;
    for (size_t k = m.size(); k-- > 0;) {
      uint64_t cur = (rem << 32) | m[k];
      m[k] = uint32_t(cur / 1000000000u);
      rem = cur % 1000000000u;
    }
    while (!m.empty() && m.back() == 0) m.pop_back();
    for (int k = 0; k < 9; ++k) {
      digits.push_back(char('0' + rem % 10));
      rem /= 10;
      if (m.empty() && rem == 0) break;
    }
  }
  if (digits.empty()) digits = "0";
  if (negative) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

std::string integral_double_to_twos(double d) {
  int exp = 0;
  double frac = std::frexp(std::fabs(d), &exp);  // |d| = frac * 2^exp, frac in [0.5, 1)
  uint64_t mantissa = uint64_t(std::ldexp(frac, 53));
  int shift = exp - 53;
  limbs m;
  if (shift <= 0) {
    uint64_t v = shift <= -64 ? 0 : mantissa >> -shift;
    m = {uint32_t(v), uint32_t(v >> 32)};
  } else {
    m.assign(size_t(shift / 32) + 3, 0);
    size_t word = size_t(shift / 32);
    int bit = shift % 32;
    unsigned __int128 wide = static_cast<unsigned __int128>(mantissa) << bit;
    for (int k = 0; k < 3; ++k) m[word + size_t(k)] = uint32_t(uint64_t(wide >> (32 * k)));
  }
  while (!m.empty() && m.back() == 0) m.pop_back();
  return magnitude_to_twos(m, d < 0 && !m.empty());
}

}  // namespace ckpt::pickle::detail
