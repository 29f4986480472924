// repr(): the Python spelling of a value, for messages and reports. It is bounded three
// ways, because the graph may be huge, shared (a billion-laughs memo DAG) or cyclic: it
// stops writing at max_chars, stops descending at kMaxReprDepth, and prints a container that
// is already being printed as Python does ([...] / {...}).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt/pickle.h"
#include "pickle/pickle_text.h"

namespace ckpt::pickle {
namespace {

constexpr int kMaxReprDepth = 48;
// Decimal conversion is quadratic; longer ints are summarised.
constexpr size_t kMaxDecimalBytes = 256;

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then CPython's float_repr_style='short' layout: positional
  // for decimal exponents -4 <= e < 16, scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, std::fabs(d), std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 2 ? sci.substr(2, e - 2) : "");
  int exponent = std::stoi(sci.substr(e + 1));
  std::string out = d < 0 ? "-" : "";
  int decpt = exponent + 1;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(size_t(-decpt), '0') + digits;
    } else if (size_t(decpt) >= digits.size()) {
      out += digits + std::string(size_t(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

bool printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp >= 0x80 && cp <= 0xa0) return false;
  if (cp == 0xad || (cp >= 0xd800 && cp <= 0xdfff)) return false;
  if (cp == 0x2028 || cp == 0x2029 || (cp >= 0x200b && cp <= 0x200f) || cp == 0xfeff) return false;
  if ((cp >= 0xe000 && cp <= 0xf8ff) || (cp & 0xfffe) == 0xfffe) return false;
  return true;
}

void append_hex(std::string* out, const char* prefix, uint32_t v, int digits) {
  static const char kHex[] = "0123456789abcdef";
  *out += prefix;
  for (int i = digits - 1; i >= 0; --i) out->push_back(kHex[(v >> (4 * i)) & 15]);
}

char pick_quote(std::string_view s) {
  return s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos ? '"'
                                                                                         : '\'';
}

class printer {
 public:
  explicit printer(size_t max_chars) : max_(max_chars) {}

  std::string finish() {
    if (out_.size() <= max_) return std::move(out_);
    size_t keep = max_ > 3 ? max_ - 3 : 0;
    while (keep > 0 && (uint8_t(out_[keep]) & 0xC0) == 0x80) --keep;  // whole characters
    out_.resize(keep);
    return out_ + "...";
  }

  void put(const value* v, int depth) {
    if (full()) return;
    if (!v) {
      out_ += "<null>";
      return;
    }
    if (depth > kMaxReprDepth) {
      out_ += "...";
      return;
    }
    for (const value* open : path_) {
      if (open == v) {
        out_ += v->type == kind::list ? "[...]" : v->type == kind::dict ? "{...}" : "...";
        return;
      }
    }
    path_.push_back(v);
    put_value(v, depth);
    path_.pop_back();
  }

 private:
  bool full() const { return out_.size() > max_; }

  void put_value(const value* v, int depth) {
    switch (v->type) {
      case kind::none:
        out_ += "None";
        return;
      case kind::boolean:
        out_ += v->flag ? "True" : "False";
        return;
      case kind::integer:
        out_ += std::to_string(v->integer);
        return;
      case kind::big_integer:
        if (v->text.size() <= kMaxDecimalBytes)
          out_ += detail::twos_to_decimal(v->text);
        else
          out_ += "<int of " + std::to_string(v->text.size()) + " bytes>";
        return;
      case kind::floating:
        out_ += float_repr(v->floating);
        return;
      case kind::str:
        put_str(v->text);
        return;
      case kind::bytes:
        put_bytes(v->text);
        return;
      case kind::bytearray:
        out_ += "bytearray(";
        put_bytes(v->text);
        out_ += ")";
        return;
      case kind::tuple:
        out_ += "(";
        put_items(v->items, depth);
        out_ += v->items.size() == 1 ? ",)" : ")";
        return;
      case kind::list:
        out_ += "[";
        put_items(v->items, depth);
        out_ += "]";
        return;
      case kind::dict:
        if (v->flag) {
          out_ += "OrderedDict(";
          if (!v->items.empty()) put_dict(v->items, depth);
          out_ += ")";
        } else {
          put_dict(v->items, depth);
        }
        if (v->state) put_call(".__setstate__", v->state, depth);
        return;
      case kind::set:
      case kind::frozenset: {
        bool frozen = v->type == kind::frozenset;
        if (v->items.empty()) {
          out_ += frozen ? "frozenset()" : "set()";
          return;
        }
        out_ += frozen ? "frozenset({" : "{";
        put_items(v->items, depth);
        out_ += frozen ? "})" : "}";
        return;
      }
      case kind::global:
        out_ += v->global_module();
        out_ += '.';
        out_ += v->global_attr();
        return;
      case kind::object:
        put_object(v, depth);
        return;
      case kind::persistent_id:
        out_ += "persistent_id(";
        if (!v->items.empty()) put(v->items[0], depth + 1);
        out_ += ")";
        return;
    }
  }

  void put_items(const item_list& items, int depth) {
    for (size_t i = 0; i < items.size() && !full(); ++i) {
      if (i) out_ += ", ";
      put(items[i], depth + 1);
    }
  }

  void put_dict(const item_list& items, int depth) {
    out_ += "{";
    for (size_t i = 0; i + 1 < items.size() && !full(); i += 2) {
      if (i) out_ += ", ";
      put(items[i], depth + 1);
      out_ += ": ";
      put(items[i + 1], depth + 1);
    }
    out_ += "}";
  }

  void put_call(const char* method, const value* arg, int depth) {
    out_ += method;
    out_ += "(";
    put(arg, depth + 1);
    out_ += ")";
  }

  void put_object(const value* v, int depth) {
    const item_list& slots = v->items;
    auto slot = [&](size_t i) { return i < slots.size() ? slots[i] : nullptr; };
    put(slot(kCallable), depth + 1);
    out_ += "(";
    bool first = true;
    if (const value* args = slot(kArgs); args && args->type == kind::tuple) {
      put_items(args->items, depth + 1);
      first = args->items.empty();
    } else if (args) {
      out_ += "*";
      put(args, depth + 1);
      first = false;
    }
    if (const value* kwargs = slot(kKwargs); kwargs && kwargs->type == kind::dict) {
      for (size_t i = 0; i + 1 < kwargs->items.size() && !full(); i += 2) {
        if (!first) out_ += ", ";
        first = false;
        const value* key = kwargs->items[i];
        if (key->type == kind::str) {
          out_ += key->text;
        } else {
          put(key, depth + 1);
        }
        out_ += "=";
        put(kwargs->items[i + 1], depth + 1);
      }
    }
    out_ += ")";
    if (const value* list = slot(kListItems)) put_call(".extend", list, depth);
    if (const value* dict = slot(kDictItems)) put_call(".update", dict, depth);
    if (v->state) put_call(".__setstate__", v->state, depth);
  }

  void put_str(std::string_view s) {
    char quote = pick_quote(s);
    out_ += quote;
    for (size_t i = 0; i < s.size() && !full();) {
      uint32_t cp = detail::next_code_point(s, &i);
      if (cp == uint32_t(quote) || cp == '\\') {
        out_ += '\\';
        out_ += char(cp);
      } else if (cp == '\n') {
        out_ += "\\n";
      } else if (cp == '\r') {
        out_ += "\\r";
      } else if (cp == '\t') {
        out_ += "\\t";
      } else if (printable(cp)) {
        detail::append_utf8(&out_, cp);
      } else if (cp <= 0xff) {
        append_hex(&out_, "\\x", cp, 2);
      } else if (cp <= 0xffff) {
        append_hex(&out_, "\\u", cp, 4);
      } else {
        append_hex(&out_, "\\U", cp, 8);
      }
    }
    out_ += quote;
  }

  void put_bytes(std::string_view s) {
    char quote = pick_quote(s);
    out_ += 'b';
    out_ += quote;
    for (size_t i = 0; i < s.size() && !full(); ++i) {
      auto c = uint8_t(s[i]);
      if (c == uint8_t(quote) || c == '\\') {
        out_ += '\\';
        out_ += char(c);
      } else if (c == '\n') {
        out_ += "\\n";
      } else if (c == '\r') {
        out_ += "\\r";
      } else if (c == '\t') {
        out_ += "\\t";
      } else if (c < 0x20 || c >= 0x7f) {
        append_hex(&out_, "\\x", c, 2);
      } else {
        out_ += char(c);
      }
    }
    out_ += quote;
  }

  size_t max_;
  std::string out_;
  std::vector<const value*> path_;
};

}  // namespace

std::string repr(const value* v, size_t max_chars) {
  printer p(max_chars);
  p.put(v, 0);
  return p.finish();
}

}  // namespace ckpt::pickle
