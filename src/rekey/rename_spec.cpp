#include "rekey/rename_spec.h"

#include <re2/re2.h>

#include "ckpt/error.h"

namespace ckpt {
namespace {

[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  throw error(errc::usage, "--rename '" + spec + "': " + why);
}

// The first '=' that no backslash escapes: `a\=b=c` is the pattern `a\=b` (RE2 reads `\=`
// as a literal '=') and the replacement `c`. The '=' of a lookaround or Python-style
// backreference (`(?=`, `(?<=`, `(?P=`) is part of the pattern, so that RE2 can refuse the
// construct by name rather than the spec being cut inside it.
size_t separator(const std::string& spec) {
  auto after = [&](size_t i, const char* opener) {
    size_t n = std::char_traits<char>::length(opener);
    return i >= n && spec.compare(i - n, n, opener) == 0;
  };
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == '\\') ++i;
    else if (spec[i] == '=' && !after(i, "(?") && !after(i, "(?<") && !after(i, "(?P")) return i;
  }
  return std::string::npos;
}

// ECMAScript replacement syntax ($1, $&, $$) into RE2's rewrite syntax (\1, \0, literal
// backslashes doubled). `$`` and `$'` have no RE2 equivalent and are refused; a `$` that
// starts nothing is a literal '$', as in ECMAScript.
std::string to_rewrite(const std::string& spec, const std::string& repl, int groups) {
  std::string out;
  for (size_t i = 0; i < repl.size(); ++i) {
    char c = repl[i];
    if (c == '\\') {
      out += "\\\\";
      continue;
    }
    if (c != '$' || i + 1 == repl.size()) {
      out += c;
      continue;
    }
    char n = repl[i + 1];
    if (n == '$') {
      out += '$';
      ++i;
    } else if (n == '&') {
      out += "\\0";
      ++i;
    } else if (n == '`' || n == '\'') {
      bad_spec(spec, std::string("$") + n + " (text before or after the match) is not supported");
    } else if (n >= '0' && n <= '9') {
      int group = n - '0';
      size_t used = 1;
      // $12 is group 12 when the pattern has that many groups, else group 1 and a '2'.
      if (i + 2 < repl.size() && repl[i + 2] >= '0' && repl[i + 2] <= '9' && group * 10 + (repl[i + 2] - '0') <= groups) {
        group = group * 10 + (repl[i + 2] - '0');
        used = 2;
      }
      if (group == 0) bad_spec(spec, "$0 is not a group (use $& for the whole match)");
      if (group > groups)
        bad_spec(spec, "the replacement uses $" + std::to_string(group) + " but the pattern has " +
                           std::to_string(groups) + " group(s)");
      if (group > 9) bad_spec(spec, "groups past $9 are not supported");
      out += '\\';
      out += char('0' + group);
      i += used;
    } else {
      out += '$';
    }
  }
  return out;
}

}  // namespace

key_op make_rename_op(const std::string& spec) {
  size_t eq = separator(spec);
  if (eq == std::string::npos || eq == 0)
    throw error(errc::usage, "--rename expects REGEX=REPLACEMENT (a '=' in REGEX is written \\=), got '" + spec + "'");
  key_op op = make_op(key_op::rename, spec);
  const std::string pattern = spec.substr(0, eq), repl = spec.substr(eq + 1);
  RE2::Options options;
  options.set_log_errors(false);  // the library prints nothing; the error below says it all
  auto re = std::make_shared<const RE2>(pattern, options);
  if (!re->ok()) {
    std::string hint;
    if (re->error_code() == RE2::ErrorBadPerlOp || re->error_code() == RE2::ErrorBadEscape ||
        re->error_code() == RE2::ErrorBadNamedCapture)
      hint = " (RE2 syntax: lookahead, lookbehind and backreferences are not supported)";
    bad_spec(spec, "bad regular expression '" + pattern + "': " + re->error() + hint);
  }
  op.replacement = to_rewrite(spec, repl, re->NumberOfCapturingGroups());
  std::string why;
  if (!re->CheckRewriteString(op.replacement, &why)) bad_spec(spec, why);
  op.pattern = std::move(re);
  return op;
}

std::string apply_rename(const key_op& op, const std::string& key) {
  std::string out = key;
  RE2::GlobalReplace(&out, *op.pattern, op.replacement);
  return out;
}

}  // namespace ckpt
