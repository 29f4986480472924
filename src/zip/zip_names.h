// Entry-name rules shared by the zip reader and writer: both accept exactly the names the
// other produces, so anything the writer emits reads back.
#pragma once

#include <string_view>

namespace ckpt::zip {

/// Why `name` is not a plain relative path with '/' separators ("contains a backslash",
/// "has a '..' component", ...), or nullptr when it is one. UTF-8 is checked separately.
const char* name_problem(std::string_view name);

/// Well-formed UTF-8: no overlong forms, surrogates or code points past U+10FFFF.
bool valid_utf8(std::string_view s);

}  // namespace ckpt::zip
