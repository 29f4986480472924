// Internal: the one definition of each piece of text made from a file's values for error
// messages and reports (quoted names, hex numbers and bytes, shapes, Python type names), so
// that every layer says the same thing the same way. Terminal safety of whole lines is
// base/text_escape.h's job; these forms are already free of control bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/pickle.h"

namespace ckpt::text {

/// `s` in single quotes for an error message: printable ASCII as is, every other byte
/// (controls, quote, backslash, anything >= 0x7f) as \xNN; cut after `max_shown` bytes
/// with "...". Always one line, whatever the file holds.
std::string quote(std::string_view s, size_t max_shown = 200);

/// "0x1f".
std::string hex(uint64_t v);

/// Up to `max_bytes` bytes as lowercase hex pairs separated by spaces: "50 4b 03 04".
std::string hex_bytes(const uint8_t* p, size_t n, size_t max_bytes = 8);

/// "[2, 3]"; "[]" for a scalar.
std::string shape(const std::vector<int64_t>& dims);
std::string shape(const std::vector<uint64_t>& dims);

/// The Python type of a decoded pickle value of kind `k`: "int", "str", "dict", ...
const char* python_type_name(pickle::kind k);

/// True when `s` ends with `suffix`.
inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// `s` between single quotes, as it is: for paths and names in an error line, which the
/// printer escapes whole (quote() escapes and cuts; a path must stay usable as typed).
inline std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

/// The first `max_shown` of `names` joined by ", ", then ", ... (N more)" for the rest.
std::string join_names(const std::vector<std::string>& names, size_t max_shown = SIZE_MAX);

/// The last element of a '/'-separated path: "a/b/c.pt" -> "c.pt".
std::string base_name(const std::string& path);

/// The directory holding `path`: "a/b/c.pt" -> "a/b", "/c.pt" -> "/", "c.pt" -> ".".
std::string parent_directory(const std::string& path);

/// `name` inside directory `dir`: "" is the current directory, "/" the root.
std::string file_in(const std::string& dir, const std::string& name);

/// Module paths joined by '.', an empty side (the root module) left out.
std::string join_dotted(const std::string& a, const std::string& b);

}  // namespace ckpt::text
