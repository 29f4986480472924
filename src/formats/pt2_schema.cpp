#include "formats/pt2_schema.h"

#include <cctype>
#include <memory>

#include "base/ordered_json.h"
#include "base/text.h"

namespace ckpt::detail::pt2s {

void where::fail(errc kind, const std::string& what) const { throw error(kind, record + ": " + what, offset); }

json parse(std::string_view text, const where& w, const detail::left_out_members& leave_out) {
  // The schema nests a dozen levels; a subgraph of a higher-order op adds a few per level of
  // nesting. nlohmann's parser is iterative, but its callers (dump, comparisons, our walks)
  // are not: a depth bound keeps a hostile "[[[[..." from reaching them.
  constexpr size_t kMaxDepth = 200;
  return parse_ordered_json(text, kMaxDepth, [&w](const json_failure& f) {
    if (f.too_deep) w.fail(errc::corrupt, "JSON " + f.what);
    // nlohmann's message names the byte within the record; one line, no control bytes.
    w.fail(errc::corrupt, std::string("not valid JSON: ") + text::quote(f.what, 160));
  }, leave_out);
}

std::pair<std::string, const json*> union_of(const json& j, const where& w, const std::string& what) {
  if (!j.is_object() || j.size() != 1)
    w.fail(errc::corrupt, what + " must be an object of one member (a union), not " +
                              (j.is_object() ? std::to_string(j.size()) + " members" : std::string(j.type_name())));
  auto it = j.begin();
  return {it.key(), &it.value()};
}

const json& member(const json& obj, const char* key, const where& w, const std::string& what) {
  if (!obj.is_object()) w.fail(errc::corrupt, what + " must be an object, not " + std::string(obj.type_name()));
  auto it = obj.find(key);
  if (it == obj.end()) w.fail(errc::corrupt, what + " has no '" + key + "'");
  return *it;
}

const json* optional_member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t to_int(const json& j, const where& w, const std::string& what) {
  if (j.is_number_integer() && (j.is_number_unsigned() ? j.get<uint64_t>() <= uint64_t(INT64_MAX) : true))
    return j.get<int64_t>();
  w.fail(errc::corrupt, what + " must be an integer within int64, not " +
                            (j.is_number() ? text::quote(j.dump(), 40) : std::string(j.type_name())));
}

bool to_bool(const json& j, const where& w, const std::string& what) {
  if (!j.is_boolean()) w.fail(errc::corrupt, what + " must be true or false, not " + std::string(j.type_name()));
  return j.get<bool>();
}

const std::string& to_string(const json& j, const where& w, const std::string& what) {
  if (!j.is_string()) w.fail(errc::corrupt, what + " must be a string, not " + std::string(j.type_name()));
  return j.get_ref<const std::string&>();
}

const json& to_object(const json& j, const where& w, const std::string& what) {
  if (!j.is_object()) w.fail(errc::corrupt, what + " must be an object, not " + std::string(j.type_name()));
  return j;
}

const json& to_array(const json& j, const where& w, const std::string& what) {
  if (!j.is_array()) w.fail(errc::corrupt, what + " must be an array, not " + std::string(j.type_name()));
  return j;
}

std::optional<dtype> scalar_type(int64_t code) {
  // torch/_export/serde/schema.py ScalarType; formats.md §14.3.
  switch (code) {
    case 1: return dtype::uint8;
    case 2: return dtype::int8;
    case 3: return dtype::int16;
    case 4: return dtype::int32;
    case 5: return dtype::int64;
    case 6: return dtype::float16;
    case 7: return dtype::float32;
    case 8: return dtype::float64;
    case 9: return dtype::complex32;
    case 10: return dtype::complex64;
    case 11: return dtype::complex128;
    case 12: return dtype::boolean;
    case 13: return dtype::bfloat16;
    case 28: return dtype::uint16;
    case 29: return dtype::float8_e4m3fn;
    case 30: return dtype::float8_e5m2;
    case 31: return dtype::float8_e4m3fnuz;
    case 32: return dtype::float8_e5m2fnuz;
    default: return std::nullopt;
  }
}

const char* layout_name(int64_t code) {
  static const char* const kNames[] = {"Unknown", "SparseCoo", "SparseCsr", "SparseCsc",
                                       "SparseBsr", "SparseBsc", "_mkldnn", "Strided"};
  return code >= 0 && code < 8 ? kNames[code] : nullptr;
}

pt2::dim sym_int(const json& j, const where& w, const std::string& what) {
  auto [tag, v] = union_of(j, w, what);
  pt2::dim d;
  if (tag == "as_int") {
    d.value = to_int(*v, w, what);
    return d;
  }
  if (tag != "as_expr") w.fail(errc::corrupt, what + ": unknown SymInt variant " + text::quote(tag, 40));
  d.raw = to_string(member(*v, "expr_str", w, what), w, what + " expr_str");
  if (const json* hint = optional_member(*v, "hint")) {
    auto [htag, hv] = union_of(*hint, w, what + " hint");
    if (htag == "as_int") d.hint = to_int(*hv, w, what + " hint");
    else if (htag != "as_bool" && htag != "as_float")
      w.fail(errc::corrupt, what + ": unknown hint variant " + text::quote(htag, 40));
  }
  if (auto r = render_srepr(d.raw)) {
    d.expr = *r;
  } else {
    d.expr = d.raw;
    d.rendered = false;
  }
  return d;
}

tensor_meta parse_tensor_meta(const json& j, const where& w, const std::string& what) {
  tensor_meta m;
  to_object(j, w, what);
  const int64_t code = to_int(member(j, "dtype", w, what), w, what + " dtype");
  auto t = scalar_type(code);
  if (!t)
    w.fail(errc::corrupt, what + ": dtype " + std::to_string(code) +
                              " is not a ScalarType of the export schema (torch/_export/serde/schema.py)");
  m.type = *t;
  const json& sizes = to_array(member(j, "sizes", w, what), w, what + " sizes");
  const json& strides = to_array(member(j, "strides", w, what), w, what + " strides");
  if (sizes.size() > 64) w.fail(errc::corrupt, what + ": " + std::to_string(sizes.size()) + " dimensions");
  for (const auto& s : sizes) m.sizes.push_back(sym_int(s, w, what + " size"));
  for (const auto& s : strides) m.strides.push_back(sym_int(s, w, what + " stride"));
  if (m.sizes.size() != m.strides.size())
    w.fail(errc::corrupt, what + ": " + std::to_string(m.sizes.size()) + " sizes but " +
                              std::to_string(m.strides.size()) + " strides");
  m.storage_offset = sym_int(member(j, "storage_offset", w, what), w, what + " storage_offset");
  m.requires_grad = to_bool(member(j, "requires_grad", w, what), w, what + " requires_grad");
  const json& dev = member(j, "device", w, what);
  m.device = to_string(member(dev, "type", w, what + " device"), w, what + " device type");
  if (m.device.empty() || m.device.size() > 64)
    w.fail(errc::corrupt, what + ": device type " + text::quote(m.device, 64));
  if (const json* index = optional_member(dev, "index")) {
    const int64_t i = to_int(*index, w, what + " device index");
    if (i < 0) w.fail(errc::corrupt, what + ": device index " + std::to_string(i));
    m.device += ":" + std::to_string(i);
  }
  m.layout = to_int(member(j, "layout", w, what), w, what + " layout");
  if (!layout_name(m.layout))
    w.fail(errc::corrupt, what + ": layout " + std::to_string(m.layout) + " is not a Layout of the export schema");
  return m;
}

// ---------------------------------------------------------------------------------------
// sympy srepr -> text

namespace {

struct expr {
  std::string head;                  // "Symbol", "Integer", "Add", ...; "" for a literal
  std::string literal;               // an integer's digits, a symbol's name
  std::vector<std::unique_ptr<expr>> args;
};

class srepr_parser {
 public:
  explicit srepr_parser(std::string_view s) : s_(s) {}
  std::unique_ptr<expr> parse_all() {
    auto e = parse(0);
    skip_space();
    if (!e || pos_ != s_.size()) return nullptr;
    return e;
  }

 private:
  void skip_space() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::string identifier() {
    skip_space();
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  // A literal argument: an integer, a quoted name, or a keyword's value (True/False).
  std::unique_ptr<expr> literal() {
    skip_space();
    auto e = std::make_unique<expr>();
    if (pos_ < s_.size() && (s_[pos_] == '\'' || s_[pos_] == '"')) {
      const char q = s_[pos_++];
      size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] != q) {
        const unsigned char ch = static_cast<unsigned char>(s_[pos_]);
        if (!(std::isalnum(ch) || ch == '_')) return nullptr;  // symbols are s0, u3, ...
        ++pos_;
      }
      if (pos_ == s_.size() || pos_ == start) return nullptr;
      e->literal = std::string(s_.substr(start, pos_ - start));
      ++pos_;
      return e;
    }
    size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    size_t digits = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == digits || pos_ - digits > 19) return nullptr;
    e->literal = std::string(s_.substr(start, pos_ - start));
    return e;
  }
  std::unique_ptr<expr> parse(int depth) {
    if (depth > 64) return nullptr;
    skip_space();
    if (pos_ < s_.size() && (s_[pos_] == '\'' || s_[pos_] == '"' || s_[pos_] == '-' ||
                             std::isdigit(static_cast<unsigned char>(s_[pos_]))))
      return literal();
    auto e = std::make_unique<expr>();
    e->head = identifier();
    if (e->head.empty() || !eat('(')) return nullptr;
    if (eat(')')) return e;
    do {
      // keyword=value (Symbol's assumptions): dropped.
      size_t save = pos_;
      std::string id = identifier();
      if (!id.empty() && eat('=')) {
        std::string value = identifier();
        if (value.empty()) return nullptr;
        continue;
      }
      pos_ = save;
      auto a = parse(depth + 1);
      if (!a) return nullptr;
      e->args.push_back(std::move(a));
    } while (eat(','));
    if (!eat(')')) return nullptr;
    return e;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// Precedence: 1 sum, 2 product/quotient, 3 power, 4 atom.
struct rendered {
  std::string text;
  int prec;
};

std::optional<rendered> render(const expr& e);

std::optional<std::string> operand(const expr& e, int min_prec) {
  auto r = render(e);
  if (!r) return std::nullopt;
  return r->prec < min_prec ? "(" + r->text + ")" : r->text;
}

std::optional<rendered> render(const expr& e) {
  if (e.head.empty()) return std::nullopt;  // a bare literal is an argument, not an expression
  auto arg_literal = [&](size_t i) -> const std::string* {
    return i < e.args.size() && e.args[i]->head.empty() ? &e.args[i]->literal : nullptr;
  };
  if (e.head == "Symbol") {
    const std::string* name = arg_literal(0);
    if (!name || e.args.size() != 1 || name->empty() || (*name)[0] == '-' ||
        std::isdigit(static_cast<unsigned char>((*name)[0])))
      return std::nullopt;
    return rendered{*name, 4};
  }
  if (e.head == "Integer") {
    const std::string* v = arg_literal(0);
    if (!v || e.args.size() != 1 || v->empty() || !(std::isdigit(static_cast<unsigned char>(v->back()))))
      return std::nullopt;
    return rendered{*v, (*v)[0] == '-' ? 1 : 4};
  }
  if (e.head == "Add") {
    if (e.args.size() < 2) return std::nullopt;
    // sympy orders the constant first; a reader expects "s0 - 1".
    std::vector<const expr*> terms;
    for (const auto& a : e.args)
      if (a->head != "Integer") terms.push_back(a.get());
    for (const auto& a : e.args)
      if (a->head == "Integer") terms.push_back(a.get());
    std::string out;
    for (size_t i = 0; i < terms.size(); ++i) {
      auto r = render(*terms[i]);
      if (!r) return std::nullopt;
      if (i == 0) {
        out = r->text;
      } else if (!r->text.empty() && r->text[0] == '-') {
        out += " - " + r->text.substr(1);
      } else {
        out += " + " + (r->prec < 1 ? "(" + r->text + ")" : r->text);
      }
    }
    return rendered{out, 1};
  }
  if (e.head == "Mul") {
    if (e.args.size() < 2) return std::nullopt;
    std::string out;
    size_t first = 0;
    if (e.args[0]->head == "Integer" && arg_literal(0) == nullptr) {
      const std::string* v = e.args[0]->args.empty() ? nullptr : &e.args[0]->args[0]->literal;
      if (v && *v == "-1") {
        out = "-";
        first = 1;
      }
    }
    for (size_t i = first; i < e.args.size(); ++i) {
      auto t = operand(*e.args[i], i == 0 ? 1 : 2);
      if (!t) return std::nullopt;
      out += (i > first ? "*" : "") + *t;
    }
    // "-s0" sums as a negative term: prec 1 so "a + -s0" renders as "a - s0".
    return rendered{out, first ? 1 : 2};
  }
  if (e.head == "FloorDiv" || e.head == "Mod") {
    if (e.args.size() != 2) return std::nullopt;
    auto a = operand(*e.args[0], 2), b = operand(*e.args[1], 3);
    if (!a || !b) return std::nullopt;
    return rendered{*a + (e.head == "Mod" ? " % " : "//") + *b, 2};
  }
  if (e.head == "Pow") {
    if (e.args.size() != 2) return std::nullopt;
    auto a = operand(*e.args[0], 4), b = operand(*e.args[1], 3);
    if (!a || !b) return std::nullopt;
    return rendered{*a + "**" + *b, 3};
  }
  if (e.head == "Max" || e.head == "Min") {
    if (e.args.size() < 2) return std::nullopt;
    std::string out = e.head + "(";
    for (size_t i = 0; i < e.args.size(); ++i) {
      auto r = render(*e.args[i]);
      if (!r) return std::nullopt;
      out += (i ? ", " : "") + r->text;
    }
    return rendered{out + ")", 4};
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> render_srepr(std::string_view srepr) {
  if (srepr.size() > 4096) return std::nullopt;
  auto e = srepr_parser(srepr).parse_all();
  if (!e) return std::nullopt;
  auto r = render(*e);
  if (!r) return std::nullopt;
  return r->text;
}

}  // namespace ckpt::detail::pt2s
