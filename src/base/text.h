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

}  // namespace ckpt::text
