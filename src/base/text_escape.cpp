#include "base/text_escape.h"

#include <cstdint>
#include <cstdio>

namespace ckpt {
namespace {

// Length of the valid UTF-8 sequence at s[i] (1..4) and its code point, or 0 if invalid
// (overlong forms, surrogates and values past U+10FFFF are invalid).
size_t utf8_at(std::string_view s, size_t i, uint32_t* cp) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  size_t n;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Characters that are invisible or change how the rest of the line is laid out.
bool is_format_char(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) ||      // C1 controls (0x9b is CSI)
         cp == 0x061C ||                    // Arabic letter mark
         (cp >= 0x200B && cp <= 0x200F) ||  // zero-width characters, LRM, RLM
         (cp >= 0x2028 && cp <= 0x202E) ||  // line/paragraph separators, bidi embeddings and overrides
         (cp >= 0x2060 && cp <= 0x2069) ||  // word joiner, invisible operators, bidi isolates
         cp == 0xFEFF ||                    // zero-width no-break space
         (cp >= 0xFFF9 && cp <= 0xFFFB);    // interlinear annotation controls
}

void append_hex(std::string& out, const char* format, unsigned value) {
  char buf[12];
  std::snprintf(buf, sizeof buf, format, value);
  out += buf;
}

// The one escaping routine; `quoting` adds the \\ and \" escapes of display_name.
// Returns whether anything needed escaping.
bool escape_into(std::string_view s, bool quoting, std::string& out) {
  bool escaped = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    size_t n = utf8_at(s, i, &cp);
    if (n == 0) {
      append_hex(out, "\\x%02x", static_cast<uint8_t>(s[i]));
      escaped = true;
      ++i;
      continue;
    }
    if (cp < 0x20 || cp == 0x7F) {
      escaped = true;
      switch (cp) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default: append_hex(out, "\\x%02x", cp);
      }
    } else if (is_format_char(cp)) {
      escaped = true;
      append_hex(out, "\\u%04x", cp);
    } else if (quoting && (cp == '\\' || cp == '"')) {
      out += '\\';
      out += char(cp);
    } else {
      out.append(s.data() + i, n);
    }
    i += n;
  }
  return escaped;
}

// Printable ASCII (0x20-0x7E) is written as it is by escape_into, quoting or not, and sets
// no `escaped`: the common name needs no pass over code points (a tenth of the text
// inspect of a set of 20,000 tensors went there).
bool printable_ascii(std::string_view s) {
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c > 0x7E) return false;
  }
  return true;
}

}  // namespace

std::string escape_controls(std::string_view s) {
  if (printable_ascii(s)) return std::string(s);
  std::string out;
  out.reserve(s.size());
  escape_into(s, false, out);
  return out;
}

std::string display_name(std::string_view s) {
  if (!s.empty() && s.front() != '"' && printable_ascii(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  bool escaped = escape_into(s, true, out);
  // A plain name that starts with a quote is quoted too, so it cannot pass for an escaped
  // one; an empty name is shown as "".
  if (!escaped && !s.empty() && s.front() != '"') return std::string(s);
  out += '"';
  return out;
}

}  // namespace ckpt
