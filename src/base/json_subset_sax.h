// Internal: a reader of the JSON that writers of metadata files produce (strings of
// printable ASCII without escapes, unsigned integers without fraction or exponent, true,
// false, null, objects, arrays) that feeds a nlohmann SAX handler the events nlohmann's own
// parser would feed it for the same text, several times faster. It stops at anything else
// and says so: the caller then gives a fresh handler to nlohmann::json::sax_parse, which
// reads the text in full and alone reports what is wrong with it (docs/formats.md §6.2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::detail {

/// Feeds `sax` the events of `text` and returns true when the whole text is one JSON
/// value of the subset above (surrounded by JSON whitespace). Returns false as soon as it
/// meets anything else (the handler may have been fed a prefix of the events); also when
/// the handler returns false. Whatever the handler throws passes through: it would throw
/// the same at the same event under nlohmann's parser, which feeds the same prefix.
/// Nesting is tracked on the heap, not the call stack; the handler bounds the depth.
template <class Sax>
bool json_subset_sax(std::string_view text, Sax& sax) {
  const char* p = text.data();
  const char* const end = p + text.size();
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  auto skip_ws = [&] {
    while (p != end && ws(*p)) ++p;
  };
  std::string s;
  // A string at p (its opening quote), into s.
  auto string = [&]() -> bool {
    if (p == end || *p != '"') return false;
    const char* start = ++p;
    for (; p != end; ++p) {
      const unsigned char c = static_cast<unsigned char>(*p);
      if (c == '"') {
        s.assign(start, size_t(p - start));
        ++p;
        return true;
      }
      if (c < 0x20 || c >= 0x7f || c == '\\') return false;
    }
    return false;
  };
  auto literal = [&](std::string_view word) -> bool {
    if (size_t(end - p) < word.size() || std::string_view(p, word.size()) != word) return false;
    p += word.size();
    return p == end || ws(*p) || *p == ',' || *p == ']' || *p == '}';
  };
  std::vector<char> open;  // '{' or '[' per container being read
  for (;;) {
    // A value (after a key, a '[' or a ',' in an array, or at the start).
    skip_ws();
    if (p == end) return false;
    const char c = *p;
    if (c == '{' || c == '[') {
      ++p;
      if (!(c == '{' ? sax.start_object(std::size_t(-1)) : sax.start_array(std::size_t(-1)))) return false;
      skip_ws();
      if (p != end && *p == (c == '{' ? '}' : ']')) {
        ++p;
        if (!(c == '{' ? sax.end_object() : sax.end_array())) return false;
      } else {
        open.push_back(c);
        if (c == '{') {
          if (!string() || !sax.key(s)) return false;
          skip_ws();
          if (p == end || *p++ != ':') return false;
        }
        continue;
      }
    } else if (c == '"') {
      if (!string() || !sax.string(s)) return false;
    } else if (c >= '0' && c <= '9') {
      const char* start = p;
      uint64_t v = 0;
      while (p != end && *p >= '0' && *p <= '9') v = v * 10 + uint64_t(*p++ - '0');
      const size_t n = size_t(p - start);
      // Up to 19 digits always fits; a leading zero, a fraction or an exponent is not ours.
      if (n > 19 || (n > 1 && *start == '0')) return false;
      if (p != end && !(ws(*p) || *p == ',' || *p == ']' || *p == '}')) return false;
      if (!sax.number_unsigned(v)) return false;
    } else if (c == 't') {
      if (!literal("true") || !sax.boolean(true)) return false;
    } else if (c == 'f') {
      if (!literal("false") || !sax.boolean(false)) return false;
    } else if (c == 'n') {
      if (!literal("null") || !sax.null()) return false;
    } else {
      return false;
    }
    // After a value: a separator, or the end of containers, or of the text.
    for (;;) {
      skip_ws();
      if (open.empty()) return p == end;
      if (p == end) return false;
      const char d = *p++;
      if (d == ',') {
        if (open.back() == '{') {
          skip_ws();
          if (!string() || !sax.key(s)) return false;
          skip_ws();
          if (p == end || *p++ != ':') return false;
        }
        break;  // the next value
      }
      if (d != (open.back() == '{' ? '}' : ']')) return false;
      open.pop_back();
      if (!(d == '}' ? sax.end_object() : sax.end_array())) return false;
    }
  }
}

}  // namespace ckpt::detail
