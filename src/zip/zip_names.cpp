#include "zip/zip_names.h"

#include <cstdint>

namespace ckpt::zip {

const char* name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  for (char c : name) {
    if (c == '\0') return "contains a NUL byte";
    if (c == '\\') return "contains a backslash";
  }
  if (name.front() == '/') return "is an absolute path";
  if (name.size() >= 2 && name[1] == ':') return "starts with a drive letter";
  if (name.back() == '/') return "ends with '/' (a directory)";
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view part = name.substr(start, end - start);
    if (part.empty()) return "has an empty path component";
    if (part == ".") return "has a '.' component";
    if (part == "..") return "has a '..' component";
    start = end + 1;
  }
  return nullptr;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return false;
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace ckpt::zip
