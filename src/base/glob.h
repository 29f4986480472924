// Internal: the key globs of --select and --plan, matched as Python's fnmatch.fnmatchcase
// matches them (docs/formats.md §16): the rule the tests' reference uses, and one that
// sees every byte of a key (fnmatch(3) stops at a NUL, and reads '\' as an escape).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt::text {

/// A pattern compiled once, for the many keys (and DCP chunks) a plan is matched against:
/// `*` any run, `?` one character, `[...]` and `[!...]` a class with ranges, compared by
/// Unicode code point, nothing else special.
class glob {
 public:
  explicit glob(std::string_view pattern);
  /// True when the pattern matches all of `key`.
  bool matches(std::string_view key) const;

  struct item {
    enum kind { literal, any, star, cls, never };
    explicit item(kind what, char32_t ch = 0) : k(what), c(ch) {}
    kind k;
    char32_t c;                                         // literal
    bool negated = false;                               // cls
    std::u32string chars;                               // cls: single members
    std::vector<std::pair<char32_t, char32_t>> ranges;  // cls
    bool contains(char32_t x) const;
  };

 private:
  std::vector<item> items_;
};

/// glob(pattern).matches(key), for one key.
inline bool glob_match(std::string_view pattern, std::string_view key) { return glob(pattern).matches(key); }

}  // namespace ckpt::text
