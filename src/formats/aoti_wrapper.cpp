// The generated wrapper.cpp of an AOTInductor model, read as text (formats.md §15.3-15.4):
// the model constructor's base-class arguments and assignments (constants_info_[i].*,
// inputs_info_, outputs_info_, in_spec_, out_spec_), the check_input_<i>() blocks and
// run_impl's symbolic sizes. The file is hostile input: only these line shapes are
// understood, every number and index is bounded, and nothing else of the C++ is trusted.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "ckpt/aoti.h"
#include "ckpt/error.h"

namespace ckpt::aoti {
namespace {

constexpr size_t kMaxConstants = 1u << 20;
constexpr size_t kMaxIo = 1u << 16;
constexpr size_t kMaxDims = 64;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool eat(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

class wrapper_parser {
 public:
  wrapper_parser(std::string_view text, model& m, std::optional<uint64_t> base) : text_(text), m_(m), base_(base) {}

  void run() {
    size_t pos = 0;
    while (pos < text_.size()) {
      size_t end = text_.find('\n', pos);
      if (end == std::string_view::npos) end = text_.size();
      ++line_no_;
      line_start_ = pos;
      line(trim(text_.substr(pos, end - pos)));
      pos = end + 1;
    }
    finish();
  }

 private:
  [[noreturn]] void fail(errc kind, const std::string& what) const {
    std::string where = "wrapper.cpp line " + std::to_string(line_no_) + ": ";
    throw error(kind, where + what, base_ ? std::optional<uint64_t>(*base_ + line_start_) : std::nullopt);
  }

  int64_t number(std::string_view s, bool allow_negative = false) const {
    s = trim(s);
    while (!s.empty() && (s.back() == 'L' || s.back() == 'l' || s.back() == 'U' || s.back() == 'u')) s.remove_suffix(1);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty())
      fail(errc::corrupt, "expected an integer, found '" + std::string(s.substr(0, 40)) + "'");
    if (v < 0 && !allow_negative) fail(errc::corrupt, "negative value " + std::to_string(v));
    return v;
  }

  // A C++ string literal as Inductor writes one: "text" with \\ and \" the only escapes.
  std::string literal(std::string_view s) const {
    s = trim(s);
    if (s.size() < 2 || s.front() != '"' || s.back() != '"') fail(errc::corrupt, "expected a string literal");
    s = s.substr(1, s.size() - 2);
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '"') fail(errc::corrupt, "unescaped quote in a string literal");
      if (s[i] != '\\') {
        out += s[i];
        continue;
      }
      if (i + 1 >= s.size() || (s[i + 1] != '\\' && s[i + 1] != '"'))
        fail(errc::unsupported, "string literal with an escape ckptool does not decode");
      out += s[++i];
    }
    return out;
  }

  std::vector<int64_t> int_list(std::string_view s) const {
    s = trim(s);
    if (s.size() < 2 || s.front() != '{' || s.back() != '}') fail(errc::corrupt, "expected {n, ...}");
    s = trim(s.substr(1, s.size() - 2));
    std::vector<int64_t> out;
    while (!s.empty()) {
      size_t comma = s.find(',');
      std::string_view item = trim(s.substr(0, comma));
      if (!item.empty()) out.push_back(number(item));
      if (out.size() > kMaxDims) fail(errc::limit, "more than " + std::to_string(kMaxDims) + " dimensions");
      if (comma == std::string_view::npos) break;
      s = s.substr(comma + 1);
    }
    return out;
  }

  // "name[<index>]<rest>" -> index, with `rest` left after ']'.
  size_t index(std::string_view& s, size_t limit, const char* what) const {
    if (!eat(s, "[")) fail(errc::corrupt, std::string("expected ") + what + "[i]");
    size_t close = s.find(']');
    if (close == std::string_view::npos) fail(errc::corrupt, std::string("unterminated ") + what + " index");
    int64_t i = number(s.substr(0, close));
    if (uint64_t(i) >= limit)
      fail(errc::corrupt, std::string(what) + " index " + std::to_string(i) + " out of range (the model declares " +
                              std::to_string(limit) + ")");
    s.remove_prefix(close + 1);
    return size_t(i);
  }

  // "X = VALUE;" after a field name: VALUE.
  std::string_view assigned(std::string_view s) const {
    s = trim(s);
    if (!eat(s, "=")) fail(errc::corrupt, "expected an assignment");
    s = trim(s);
    if (s.empty() || s.back() != ';') fail(errc::corrupt, "assignment without ';'");
    return trim(s.substr(0, s.size() - 1));
  }

  static std::string after(std::string_view s, std::string_view marker) {
    size_t at = s.find(marker);
    if (at == std::string_view::npos) return {};
    s.remove_prefix(at + marker.size());
    size_t end = 0;
    while (end < s.size() && (std::isalnum(static_cast<unsigned char>(s[end])) || s[end] == '_')) ++end;
    return std::string(s.substr(0, end));
  }

  void line(std::string_view s) {
    if (s.empty() || s.substr(0, 2) == "//") return;
    if (base_args_pending_) return base_args(s);
    if (s.find("AOTInductorModelBase(") != std::string_view::npos && s.find("class ") == std::string_view::npos &&
        in_constructor_) {
      if (seen_base_) fail(errc::corrupt, "a second AOTInductorModelBase(...) initializer");
      seen_base_ = true;
      base_args_pending_ = true;
      s.remove_prefix(s.find("AOTInductorModelBase(") + 21);
      return base_args(s);
    }
    if (s.find("AOTInductorModel::AOTInductorModel(") != std::string_view::npos) in_constructor_ = true;
    if (in_constructor_) return constructor_line(s);
    if (s.find("static void check_input_") != std::string_view::npos) {
      std::string_view rest = s.substr(s.find("check_input_") + 12);
      size_t paren = rest.find('(');
      const size_t i = size_t(number(rest.substr(0, paren)));
      if (!seen_base_ || i >= m_.num_inputs) fail(errc::corrupt, "check_input_" + std::to_string(i) + " for no input");
      check_ = i;
      return;
    }
    if (s.find("_check_aoti_runtime_check_inputs_env") != std::string_view::npos ||
        s.find("AOTInductorModel::run_impl(") != std::string_view::npos) {
      check_.reset();
      in_run_impl_ = s.find("run_impl(") != std::string_view::npos;
      return;
    }
    if (check_) return check_line(s);
    if (in_run_impl_) return run_impl_line(s);
  }

  // AOTInductorModelBase(num_inputs, num_outputs, num_constants, device_str, cubin_dir
  // [, include_weights]) {, possibly over several lines.
  void base_args(std::string_view s) {
    base_text_ += std::string(s);
    if (base_text_.size() > 4096) fail(errc::corrupt, "AOTInductorModelBase(...) too long");
    size_t close = base_text_.find(')');
    // cubin_dir is std::move(cubin_dir): the first ')' closes that, the next the call.
    if (close == std::string::npos) return;
    size_t next = base_text_.find(')', close + 1);
    if (next == std::string::npos) return;
    base_args_pending_ = false;
    std::vector<std::string_view> args;
    std::string_view all(base_text_.data(), next);
    while (true) {
      size_t comma = all.find(',');
      args.push_back(trim(all.substr(0, comma)));
      if (comma == std::string_view::npos) break;
      all.remove_prefix(comma + 1);
    }
    if (args.size() < 5 || args.size() > 6) fail(errc::corrupt, "AOTInductorModelBase(...) with " + std::to_string(args.size()) + " arguments");
    m_.num_inputs = size_t(number(args[0]));
    m_.num_outputs = size_t(number(args[1]));
    size_t n = size_t(number(args[2]));
    if (m_.num_inputs > kMaxIo || m_.num_outputs > kMaxIo) fail(errc::limit, "more than 65536 inputs or outputs");
    if (n > kMaxConstants) fail(errc::limit, std::to_string(n) + " constants (more than 2^20)");
    m_.constants.assign(n, constant{});
    fields_.assign(n, {});
    m_.output_names.assign(m_.num_outputs, "");
    m_.inputs.assign(m_.num_inputs, input_check{});
    for (size_t i = 0; i < m_.num_inputs; ++i) m_.inputs[i].index = i;
    if (args.size() == 6) {
      if (args[5] == "true")
        m_.include_weights = true;
      else if (args[5] == "false")
        m_.include_weights = false;
      else
        fail(errc::corrupt, "include_weights is neither true nor false");
    }
  }

  void constructor_line(std::string_view s) {
    if (s == "}") {
      in_constructor_ = false;
      return;
    }
    if (eat(s, "constants_info_")) {
      if (!seen_base_) fail(errc::corrupt, "constants_info_ before the AOTInductorModelBase(...) initializer");
      size_t i = index(s, m_.constants.size(), "constants_info_");
      if (!eat(s, ".")) fail(errc::corrupt, "expected constants_info_[i].field");
      size_t dot_end = 0;
      while (dot_end < s.size() && (std::isalnum(static_cast<unsigned char>(s[dot_end])) || s[dot_end] == '_')) ++dot_end;
      std::string field(s.substr(0, dot_end));
      s.remove_prefix(dot_end);
      // Fields of opaque (mkldnn) constants are filled by method calls: such a constant is
      // marked by its layout, and the calls carry nothing read here.
      if (trim(s).substr(0, 1) != "=") return;
      if (!fields_[i].insert(field).second) fail(errc::corrupt, "constants_info_[" + std::to_string(i) + "]." + field + " assigned twice");
      constant_field(m_.constants[i], field, assigned(s));
      if (m_.constants[i].line == 0) m_.constants[i].line = line_no_;
      return;
    }
    if (eat(s, "inputs_info_")) {
      if (!seen_base_) fail(errc::corrupt, "inputs_info_ before the AOTInductorModelBase(...) initializer");
      size_t i = index(s, m_.num_inputs, "inputs_info_");
      if (eat(s, ".name")) m_.inputs[i].name = literal(assigned(s));
      return;
    }
    if (eat(s, "outputs_info_")) {
      if (!seen_base_) fail(errc::corrupt, "outputs_info_ before the AOTInductorModelBase(...) initializer");
      size_t i = index(s, m_.num_outputs, "outputs_info_");
      if (eat(s, ".name")) m_.output_names[i] = literal(assigned(s));
      return;
    }
    if (eat(s, "in_spec_")) return spec(s, m_.in_spec);
    if (eat(s, "out_spec_")) return spec(s, m_.out_spec);
  }

  // in_spec_ = R"(<json>)"; on one line, as Inductor writes it.
  void spec(std::string_view s, std::string& out) {
    s = trim(s);
    if (!eat(s, "=")) return;
    s = trim(s);
    if (!eat(s, "R\"(") || s.size() < 4 || s.substr(s.size() - 3) != ")\";")
      fail(errc::corrupt, "a call spec that is not one raw string literal on one line");
    if (!out.empty()) fail(errc::corrupt, "a call spec assigned twice");
    out = std::string(s.substr(0, s.size() - 3));
  }

  static std::string suffix_after(std::string_view v, std::string_view prefix) {
    size_t at = v.find(prefix);
    if (at == std::string_view::npos) return {};
    return std::string(v.substr(at + prefix.size()));
  }

  void constant_field(constant& c, const std::string& field, std::string_view v) {
    if (field == "name") {
      c.name = literal(v);
    } else if (field == "original_fqn") {
      c.original_fqn = literal(v);
    } else if (field == "dtype") {
      std::string d = suffix_after(v, "cached_torch_dtype_");
      if (d.empty()) {
        d = suffix_after(v, "aoti_torch_dtype_");
        if (d.size() > 2 && d.substr(d.size() - 2) == "()") d.resize(d.size() - 2);
      }
      if (d.empty() || d.size() > 40) fail(errc::corrupt, "constant dtype '" + std::string(v.substr(0, 40)) + "' not understood");
      c.dtype_text = d;
      c.type = dtype_from_name(d);
    } else if (field == "device_type") {
      c.device = suffix_after(v, "cached_torch_device_type_");
      if (c.device.empty() || c.device.size() > 20) fail(errc::corrupt, "constant device type not understood");
    } else if (field == "offset") {
      c.offset = number(v);
    } else if (field == "data_size") {
      c.data_size = uint64_t(number(v));
    } else if (field == "from_folded") {
      if (v == "true")
        c.from_folded = true;
      else if (v != "false")
        fail(errc::corrupt, "from_folded is neither true nor false");
    } else if (field == "type") {
      std::string t = after(v, "ConstantType::");
      static const std::map<std::string, constant_kind> kinds = {
          {"Unknown", constant_kind::unknown}, {"Parameter", constant_kind::parameter},
          {"Buffer", constant_kind::buffer}, {"TensorConstant", constant_kind::tensor_constant},
          {"FoldedConstant", constant_kind::folded_constant}};
      auto it = kinds.find(t);
      if (it == kinds.end()) fail(errc::unsupported, "constant type '" + t.substr(0, 40) + "' unknown to ckptool");
      c.kind = it->second;
    } else if (field == "shape") {
      c.shape = int_list(v);
    } else if (field == "stride") {
      c.stride = int_list(v);
    } else if (field == "layout") {
      std::string l = after(v, "cached_torch_layout_");
      if (l.empty()) fail(errc::corrupt, "constant layout not understood");
      c.strided = l == "strided";
    }
    // Other fields (future additions) carry nothing ckptool reports.
  }

  // The checks of one input (formats.md §15.4).
  void check_line(std::string_view s) {
    input_check& in = m_.inputs[*check_];
    std::string dt = suffix_after(s, "_expected_dtype = aoti_torch_dtype_");
    if (!dt.empty()) {
      if (dt.size() < 3 || dt.substr(dt.size() - 3) != "();") fail(errc::corrupt, "expected dtype not understood");
      in.dtype_text = dt.substr(0, dt.size() - 3);
      return;
    }
    std::string dev = suffix_after(s, "_expected_device_type = ");
    if (!dev.empty()) {
      if (dev.back() != ';') fail(errc::corrupt, "expected device type not understood");
      int64_t d = number(std::string_view(dev).substr(0, dev.size() - 1));
      in.device = d == 0 ? "cpu" : d == 1 ? "cuda" : "device type " + std::to_string(d);
      return;
    }
    if (!eat(s, "if (")) return;
    // "N != x_size[d]) {", "N != x_stride[d]) {", "x_size[d] < N) {", "x_size[d] > N) {"
    if (s.size() < 3 || s.substr(s.size() - 3) != ") {") return;
    s.remove_suffix(3);
    auto subscript = [&](std::string_view side, const char* kind, int64_t& dim) {
      size_t at = side.find(kind);
      if (at == std::string_view::npos) return false;
      std::string_view rest = side.substr(at + std::string_view(kind).size());
      dim = int64_t(index(rest, kMaxDims, "dimension"));
      return trim(rest).empty();
    };
    int64_t dim = 0;
    size_t ne = s.find(" != ");
    if (ne != std::string_view::npos) {
      std::string_view left = s.substr(0, ne), right = s.substr(ne + 4);
      if (subscript(right, "_size", dim)) {
        set_dim(in, dim).size = number(left);
        return;
      }
      if (subscript(right, "_stride", dim)) {
        if (in.strides.size() <= size_t(dim)) in.strides.resize(size_t(dim) + 1);
        in.strides[size_t(dim)] = number(left);
      }
      return;
    }
    for (const char* op : {" < ", " > "}) {
      size_t at = s.find(op);
      if (at == std::string_view::npos) continue;
      if (!subscript(s.substr(0, at), "_size", dim)) return;
      input_dim& d = set_dim(in, dim);
      (op[1] == '<' ? d.min : d.max) = number(s.substr(at + 3), true);
      return;
    }
  }

  input_dim& set_dim(input_check& in, int64_t dim) {
    while (in.dims.size() <= size_t(dim)) {
      input_dim d;
      d.dim = int64_t(in.dims.size());
      in.dims.push_back(d);
    }
    return in.dims[size_t(dim)];
  }

  // "int64_t s77 = arg5_1_size[0];": the symbol of a dynamic size.
  void run_impl_line(std::string_view s) {
    if (!eat(s, "int64_t ")) return;
    size_t eq = s.find(" = ");
    if (eq == std::string_view::npos || s.empty() || s.back() != ';') return;
    std::string symbol(s.substr(0, eq));
    std::string_view rhs = s.substr(eq + 3);
    rhs.remove_suffix(1);
    size_t at = rhs.find("_size[");
    if (at == std::string_view::npos) return;
    std::string input(rhs.substr(0, at));
    std::string_view rest = rhs.substr(at + 5);
    int64_t dim = int64_t(index(rest, kMaxDims, "dimension"));
    if (!trim(rest).empty()) return;
    for (auto& in : m_.inputs)
      if (in.name == input) set_dim(in, dim).symbol = symbol.substr(0, 64);
  }

  void finish() {
    if (!seen_base_ || base_args_pending_)
      throw error(errc::corrupt, "wrapper.cpp: no AOTInductorModel constructor with AOTInductorModelBase(...) found",
                  base_ ? std::optional<uint64_t>(*base_) : std::nullopt);
    std::set<std::string> names;
    for (size_t i = 0; i < m_.constants.size(); ++i) {
      const constant& c = m_.constants[i];
      const std::string at = "wrapper.cpp: constants_info_[" + std::to_string(i) + "]";
      for (const char* f : {"name", "dtype", "data_size", "shape", "stride"})
        if (!fields_[i].count(f))
          throw error(errc::corrupt, at + " has no ." + f, base_ ? std::optional<uint64_t>(*base_) : std::nullopt);
      if (c.shape.size() != c.stride.size())
        throw error(errc::corrupt, at + " has " + std::to_string(c.shape.size()) + " sizes but " +
                                       std::to_string(c.stride.size()) + " strides");
      if (!names.insert(c.name).second) throw error(errc::corrupt, at + ": the constant name '" + c.name + "' twice");
    }
  }

  std::string_view text_;
  model& m_;
  std::optional<uint64_t> base_;
  size_t line_no_ = 0, line_start_ = 0;
  bool in_constructor_ = false, seen_base_ = false, base_args_pending_ = false, in_run_impl_ = false;
  std::string base_text_;
  std::vector<std::set<std::string>> fields_;
  std::optional<size_t> check_;
};

}  // namespace

void parse_wrapper(std::string_view text, model& m, std::optional<uint64_t> base) {
  wrapper_parser(text, m, base).run();
}

}  // namespace ckpt::aoti
