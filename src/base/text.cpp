#include "base/text.h"

#include <cstdio>
#include <type_traits>

namespace ckpt::text {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

template <class Int>
std::string shape_of(const std::vector<Int>& dims) {
  std::string out = "[";
  // A negative dimension is a nested tensor's that varies from one member to the next.
  for (size_t i = 0; i < dims.size(); ++i) {
    bool varies = false;
    if constexpr (std::is_signed_v<Int>) varies = dims[i] < 0;
    out += (i ? ", " : "") + (varies ? std::string("?") : std::to_string(dims[i]));
  }
  return out + "]";
}

}  // namespace

std::string quote(std::string_view s, size_t max_shown) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < max_shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += char(c);
    } else {
      out += "\\x";
      out += kHexDigits[c >> 4];
      out += kHexDigits[c & 15];
    }
  }
  if (s.size() > max_shown) out += "...";
  return out + "'";
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string hex_bytes(const uint8_t* p, size_t n, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < n && i < max_bytes; ++i) {
    if (i) out += ' ';
    out += kHexDigits[p[i] >> 4];
    out += kHexDigits[p[i] & 15];
  }
  return out;
}

std::string shape(const std::vector<int64_t>& dims) { return shape_of(dims); }
std::string shape(const std::vector<uint64_t>& dims) { return shape_of(dims); }

const char* python_type_name(pickle::kind k) {
  using pickle::kind;
  switch (k) {
    case kind::none: return "None";
    case kind::boolean: return "bool";
    case kind::integer:
    case kind::big_integer: return "int";
    case kind::floating: return "float";
    case kind::str: return "str";
    case kind::bytes: return "bytes";
    case kind::bytearray: return "bytearray";
    case kind::tuple: return "tuple";
    case kind::list: return "list";
    case kind::dict: return "dict";
    case kind::set: return "set";
    case kind::frozenset: return "frozenset";
    case kind::global: return "global";
    case kind::persistent_id: return "persistent_id";
    case kind::object: return "object";
  }
  return "object";
}

std::string join_names(const std::vector<std::string>& names, size_t max_shown) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max_shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > max_shown) out += ", ... (" + std::to_string(names.size() - max_shown) + " more)";
  return out;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string file_in(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string join_dotted(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "." + b;
}

}  // namespace ckpt::text
