// Strings that come from a file (keys, global names, entry values, messages quoting them)
// shown on a terminal: a hostile file must not move the cursor, erase or forge lines, or
// reorder text. Every human-readable output site goes through these two functions; JSON
// output has its own escaping.
#pragma once

#include <string>
#include <string_view>

namespace ckpt {

/// `s` with every byte or character a terminal would act on escaped: C0 controls (\n, \r,
/// \t, \x1b, \x00, ...), DEL, C1 controls (\u009b), invalid UTF-8 (\xff), bidirectional
/// overrides and isolates (\u202e), zero-width and line/paragraph separators. Backslashes
/// are left as they are: for lines of text that merely quote a name (error messages).
std::string escape_controls(std::string_view s);

/// A name (key, global, path) as shown in reports: unchanged when it is plain printable
/// text, else in double quotes with the escapes above plus \\ and \", so an escaped name
/// can never be mistaken for a plain one ("a\nb" is always the quoted form); "" when empty.
std::string display_name(std::string_view s);

}  // namespace ckpt
