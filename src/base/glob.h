// Internal: the key globs of --select and --plan, matched as Python's fnmatch.fnmatchcase
// matches them (docs/formats.md §16): the rule the tests' reference uses, and one that
// sees every byte of a key (fnmatch(3) stops at a NUL, and reads '\' as an escape).
#pragma once

#include <string_view>

namespace ckpt::text {

/// True when `pattern` matches all of `key`: `*` any run, `?` one character, `[...]` and
/// `[!...]` a class with ranges, compared by Unicode code point, nothing else special.
bool glob_match(std::string_view pattern, std::string_view key);

}  // namespace ckpt::text
