#include "ckpt/torchscript_code.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string_view>

#include "ckpt/error.h"
#include "base/text.h"

namespace ckpt {
namespace {

enum class tok { name, number, string, op };

struct token {
  tok kind;
  std::string_view text;
  size_t pos;
};

// One logical line: brackets and backslashes join physical lines, as in Python and in
// TorchScript's lexer.
struct logical_line {
  size_t indent = 0;
  std::vector<token> tokens;
};

bool is_name_start(unsigned char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_name_char(unsigned char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

std::vector<logical_line> split_lines(std::string_view s) {
  std::vector<logical_line> out;
  logical_line cur;
  bool at_line_start = true;
  int depth = 0;
  size_t i = 0;
  auto finish = [&]() {
    if (!cur.tokens.empty()) out.push_back(std::move(cur));
    cur = logical_line{};
    at_line_start = true;
  };
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (at_line_start) {
      size_t n = 0;
      while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i, ++n;
      cur.indent = n;
      at_line_start = false;
      continue;
    }
    if (c == '\n') {
      ++i;
      if (depth <= 0) finish();
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f') {
      ++i;
      continue;
    }
    if (c == '\\' && i + 1 < s.size() && (s[i + 1] == '\n' || s[i + 1] == '\r')) {
      i += 2;  // a continuation joins the next physical line
      continue;
    }
    if (c == '#') {
      while (i < s.size() && s[i] != '\n') ++i;
      continue;
    }
    const size_t start = i;
    if (c == '"' || c == '\'') {
      const bool triple = i + 2 < s.size() && s[i + 1] == char(c) && s[i + 2] == char(c);
      i += triple ? 3 : 1;
      while (i < s.size()) {
        if (s[i] == '\\') {
          i += 2;
          continue;
        }
        if (s[i] == char(c) && (!triple || (i + 2 < s.size() && s[i + 1] == char(c) && s[i + 2] == char(c)))) {
          i += triple ? 3 : 1;
          break;
        }
        if (!triple && s[i] == '\n') break;  // unterminated: TorchScript refuses it too
        ++i;
      }
      i = std::min(i, s.size());
      cur.tokens.push_back({tok::string, s.substr(start, i - start), start});
      continue;
    }
    if (is_name_start(c)) {
      while (i < s.size() && is_name_char(static_cast<unsigned char>(s[i]))) ++i;
      cur.tokens.push_back({tok::name, s.substr(start, i - start), start});
      continue;
    }
    if (is_digit(c) || (c == '.' && i + 1 < s.size() && is_digit(static_cast<unsigned char>(s[i + 1])))) {
      while (i < s.size()) {
        unsigned char d = static_cast<unsigned char>(s[i]);
        if (is_name_char(d) || d == '.') {
          ++i;
        } else if ((d == '+' || d == '-') && (s[i - 1] == 'e' || s[i - 1] == 'E')) {
          ++i;
        } else {
          break;
        }
      }
      cur.tokens.push_back({tok::number, s.substr(start, i - start), start});
      continue;
    }
    // Operators: the two-character ones that contain '=' must not read as an assignment.
    static const char* const kTwo[] = {"==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "%=", "&=",
                                       "|=", "^=", "->", "**", "//", ":=", "<<", ">>"};
    size_t len = 1;
    for (const char* t : kTwo)
      if (s.compare(i, 2, t) == 0) len = 2;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') depth = std::max(0, depth - 1);
    cur.tokens.push_back({tok::op, s.substr(i, len), i});
    i += len;
  }
  finish();
  return out;
}

// `CONSTANTS.c<N>` starting at t[i]: the printer's reference to entry N of constants.pkl
// (a tensor default, for instance). The importer resolves it to the stored value, and
// evaluating a default that is nothing else runs no code of the file.
std::optional<size_t> constant_reference(const std::vector<token>& t, size_t i, size_t end) {
  if (i + 3 > end) return std::nullopt;
  if (t[i].kind != tok::name || t[i].text != "CONSTANTS" || t[i + 1].text != "." || t[i + 2].kind != tok::name)
    return std::nullopt;
  if (i > 0 && t[i - 1].kind == tok::op && t[i - 1].text == ".") return std::nullopt;
  std::string_view c = t[i + 2].text;
  if (c.size() < 2 || c.size() > 12 || c[0] != 'c' || (c.size() > 2 && c[1] == '0')) return std::nullopt;
  size_t n = 0;
  for (char ch : c.substr(1)) {
    if (!is_digit(static_cast<unsigned char>(ch))) return std::nullopt;
    n = n * 10 + size_t(ch - '0');
  }
  if (i + 3 < end && t[i + 3].kind == tok::op && t[i + 3].text == ".") return std::nullopt;  // CONSTANTS.c0.attr
  return n;
}

// What TorchScript's printer writes for a default value or a class constant.
bool literal_only(const std::vector<token>& t, size_t begin, size_t end) {
  static const std::set<std::string_view> kNames = {"None", "True", "False", "inf", "nan",
                                                     "float", "torch", "device"};
  static const std::set<std::string_view> kOps = {"(", ")", "[", "]", ",", "-", "+", "."};
  if (begin >= end) return false;
  for (size_t i = begin; i < end; ++i) {
    switch (t[i].kind) {
      case tok::number:
      case tok::string:
        break;
      case tok::name:
        if (constant_reference(t, i, end)) {
          i += 2;
          break;
        }
        if (!kNames.count(t[i].text)) return false;
        break;
      case tok::op:
        if (!kOps.count(t[i].text)) return false;
        break;
    }
  }
  return true;
}

struct scanner {
  const zip::entry& entry;
  std::string qualifier;  // "__torch__.models" for code/__torch__/models.py
  std::vector<load_time_code>& out;
  std::vector<constant_default>* defaults = nullptr;  // also collect CONSTANTS.cN defaults

  void add(const std::string& owner, std::string what, size_t pos) {
    load_time_code c;
    c.record = entry.record;
    c.owner = owner.empty() ? qualifier : qualifier + "." + owner;
    // "{}" stands for the owner: "class __torch__.m.Net defines ...", "__torch__.m.Net.forward: ...".
    const size_t at = what.find("{}");
    const bool qualify = at + 2 < what.size() && what[at + 2] != ' ';
    what.replace(at, 2, qualify ? c.owner + "." : c.owner);
    c.what = std::move(what);
    if (entry.method == 0) c.offset = entry.data_offset + pos;
    out.push_back(std::move(c));
  }

  // `def NAME(params) ...`: every default must be a literal.
  void check_def(const logical_line& l, const std::string& owner) {
    const auto& t = l.tokens;
    if (t.size() < 3 || t[1].kind != tok::name) return;
    const std::string fn(t[1].text);
    size_t i = 2;
    if (t[i].text != "(") return;
    int depth = 1;
    std::string param;
    bool expect_name = true;
    for (++i; i < t.size() && depth > 0; ++i) {
      const token& k = t[i];
      if (k.kind == tok::op && (k.text == "(" || k.text == "[" || k.text == "{")) ++depth;
      if (k.kind == tok::op && (k.text == ")" || k.text == "]" || k.text == "}")) --depth;
      if (depth == 1 && k.kind == tok::name && expect_name) {
        param = std::string(k.text);
        expect_name = false;
      }
      if (depth == 1 && k.kind == tok::op && k.text == ",") expect_name = true;
      if (depth == 1 && k.kind == tok::op && k.text == "=") {
        size_t begin = i + 1, j = begin;
        int d = 1;
        for (; j < t.size(); ++j) {
          if (t[j].kind == tok::op && (t[j].text == "(" || t[j].text == "[" || t[j].text == "{")) ++d;
          if (t[j].kind == tok::op && (t[j].text == ")" || t[j].text == "]" || t[j].text == "}")) --d;
          if (d == 0 || (d == 1 && t[j].kind == tok::op && t[j].text == ",")) break;
        }
        if (defaults && j == begin + 3)
          if (auto n = constant_reference(t, begin, j))
            defaults->push_back({(owner.empty() ? qualifier : qualifier + "." + owner) + "." + fn, param, *n});
        if (!literal_only(t, begin, j))
          add(owner, "{}" + fn + ": the default of parameter '" + param +
                         "' is an expression, which LibTorch evaluates when it loads the file",
              k.pos);
        i = j - 1;  // the loop's ++i lands on the ',' or ')'
      }
    }
  }

  // `NAME : TYPE = VALUE` or `NAME = VALUE` in a class body. `__annotations__["0"] = TYPE`
  // (attributes whose names are not identifiers, as nn.Sequential's) declares a type, which
  // the importer resolves by name and never evaluates.
  void check_class_statement(const logical_line& l, const std::string& owner) {
    const auto& t = l.tokens;
    if (t.size() >= 5 && t[0].kind == tok::name && t[0].text == "__annotations__" && t[1].text == "[" &&
        t[2].kind == tok::string && t[3].text == "]" && t[4].text == "=") {
      for (size_t i = 5; i < t.size(); ++i)
        if (t[i].kind != tok::name && !(t[i].kind == tok::op && (t[i].text == "." || t[i].text == "[" ||
                                                                 t[i].text == "]" || t[i].text == ",")))
          return add(owner, "{}__annotations__: a type annotation that is not a type name", t[i].pos);
      return;
    }
    int depth = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i].kind != tok::op) continue;
      if (t[i].text == "(" || t[i].text == "[" || t[i].text == "{") ++depth;
      if (t[i].text == ")" || t[i].text == "]" || t[i].text == "}") --depth;
      if (depth == 0 && t[i].text == "=") {
        if (!literal_only(t, i + 1, t.size()))
          add(owner, "{}" + std::string(t[0].text) +
                         ": the class-level value is an expression, which LibTorch evaluates when it loads the file",
              t[i].pos);
        return;
      }
    }
  }

  void scan(std::string_view text) {
    std::string cls;             // the class being read, "" outside one
    std::optional<size_t> def;   // indent of the def whose body is being read
    std::optional<size_t> body;  // indent of the class's own statements
    size_t setstate_tokens = 0;
    for (const logical_line& l : split_lines(text)) {
      const auto& t = l.tokens;
      const bool is_def = t[0].kind == tok::name && t[0].text == "def";
      const bool is_class = t[0].kind == tok::name && t[0].text == "class";
      if (def && l.indent <= *def) def.reset();
      if (l.indent == 0) {
        def.reset();
        body.reset();
        cls.clear();
        if (is_class && t.size() > 1 && t[1].kind == tok::name) cls = std::string(t[1].text);
      }
      for (const token& k : t)
        if (k.kind == tok::name && k.text == "__setstate__") {
          ++setstate_tokens;
          add(cls, "class {} defines __setstate__, which LibTorch runs for each saved object of the class", k.pos);
        }
      if (is_def) {
        check_def(l, cls);
        if (!def) def = l.indent;
      } else if (!def && l.indent > 0 && !cls.empty()) {
        // Deeper lines outside a def are an indentation error to LibTorch's parser, which
        // then compiles nothing.
        if (!body) body = l.indent;
        if (l.indent == *body) check_class_statement(l, cls);
      }
    }
    // The lexer above is not TorchScript's: whatever spelling it missed, the method name
    // still has to appear in the text for LibTorch to find it.
    if (setstate_tokens == 0) {
      size_t pos = text.find("__setstate__");
      if (pos != std::string_view::npos) add("", "{} mentions __setstate__ where this reader sees no method name", pos);
    }
  }
};

// Scans every code/ record: LibTorch compiles code/<qualified name with '/'>.py; the
// .debug_pkl source maps beside them are pickles of strings and never compiled.
void scan_code(const zip::archive& ar, std::vector<load_time_code>& out, std::vector<constant_default>* defaults) {
  for (const zip::entry& e : ar.entries()) {
    if (e.record.compare(0, 5, "code/") != 0 || text::ends_with(e.record, ".debug_pkl")) continue;
    std::vector<uint8_t> bytes = ar.read_record(e);
    std::string qualifier(e.record.substr(5));
    if (text::ends_with(qualifier, ".py")) qualifier.resize(qualifier.size() - 3);
    std::replace(qualifier.begin(), qualifier.end(), '/', '.');
    scanner s{e, qualifier, out, defaults};
    s.scan(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
}

}  // namespace

std::vector<load_time_code> find_load_time_code(const zip::archive& ar) {
  std::vector<load_time_code> out;
  scan_code(ar, out, nullptr);
  return out;
}

std::vector<constant_default> find_constant_defaults(const zip::archive& ar) {
  std::vector<load_time_code> ignored;
  std::vector<constant_default> defaults;
  scan_code(ar, ignored, &defaults);
  return defaults;
}

std::string describe(const load_time_code& c) {
  return c.what + " (" + c.record + ")";
}

void refuse_load_time_code(const zip::archive& ar, const std::string& flag) {
  std::vector<load_time_code> found = find_load_time_code(ar);
  if (found.empty()) return;
  std::string more = found.size() > 1 ? " and " + std::to_string(found.size() - 1) + " more" : "";
  error e(errc::unsafe,
          "TorchScript code runs when LibTorch loads this file, even on meta: " + describe(found.front()) + more +
              "; not loaded (" + flag + " loads it and runs that code)",
          found.front().offset);
  throw ar.source().locate(e);
}

}  // namespace ckpt
