#include "torch/method_args.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

std::string type_text(const c10::TypePtr& t) { return t->annotation_str(); }

[[noreturn]] void fail(const std::string& method, const std::string& msg) {
  throw error(errc::usage, "method " + method + ": " + msg);
}

std::optional<int64_t> parse_int(const std::string& s) {
  if (s.empty() || s.size() > 24) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end || end == s.c_str() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  return int64_t(v);
}

std::optional<double> parse_float(const std::string& s) {
  if (s.empty() || s.size() > 64 || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (*end || end == s.c_str()) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& s) {
  if (s == "true" || s == "True" || s == "1") return true;
  if (s == "false" || s == "False" || s == "0") return false;
  return std::nullopt;
}

// "1,2,3", "[1, 2, 3]", "[]".
std::optional<std::vector<int64_t>> parse_int_list(std::string s) {
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  std::vector<int64_t> out;
  if (s.find_first_not_of(' ') == std::string::npos) return out;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
    auto v = parse_int(a == std::string::npos ? "" : item.substr(a, b - a + 1));
    if (!v) return std::nullopt;
    out.push_back(*v);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

bool takes_tensor(const c10::TypePtr& t) { return c10::TensorType::get()->isSubtypeOf(*t); }

// `text` as a value of `type`; nullopt when it is not one. Types --arg cannot express
// (tensors, dicts, lists of other than ints, classes) throw.
std::optional<c10::IValue> parse_value(const c10::TypePtr& type, const std::string& text, const std::string& method,
                                       const std::string& arg) {
  if (auto opt = type->cast<c10::OptionalType>()) {
    if (text == "None") return c10::IValue();
    return parse_value(opt->getElementType(), text, method, arg);
  }
  switch (type->kind()) {
    case c10::TypeKind::IntType:
      if (auto v = parse_int(text)) return c10::IValue(*v);
      return std::nullopt;
    case c10::TypeKind::FloatType:
      if (auto v = parse_float(text)) return c10::IValue(*v);
      return std::nullopt;
    case c10::TypeKind::NumberType:
      if (auto v = parse_int(text)) return c10::IValue(*v);
      if (auto v = parse_float(text)) return c10::IValue(*v);
      return std::nullopt;
    case c10::TypeKind::BoolType:
      if (auto v = parse_bool(text)) return c10::IValue(*v);
      return std::nullopt;
    case c10::TypeKind::StringType:
      return c10::IValue(text);
    case c10::TypeKind::NoneType:
      if (text == "None") return c10::IValue();
      return std::nullopt;
    case c10::TypeKind::ListType:
      if (type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::IntType) {
        if (auto v = parse_int_list(text)) {
          c10::List<int64_t> list;
          for (int64_t x : *v) list.push_back(x);
          return c10::IValue(std::move(list));
        }
        return std::nullopt;
      }
      break;
    default:
      break;
  }
  if (takes_tensor(type)) fail(method, "argument '" + arg + "' is a Tensor: give it with --input");
  fail(method, "argument '" + arg + "' has type " + type_text(type) +
                   ", which --arg cannot give (int, float, bool, str, None, List[int])");
}

}  // namespace

std::vector<c10::IValue> bind_arguments(const c10::FunctionSchema& schema, const std::string& method,
                                        std::vector<c10::IValue> tensors, const std::vector<arg_spec>& args) {
  const auto& formal = schema.arguments();
  // args[0] is the module for a method, whatever the code named it (def forward(s, x)
  // gives "s"): the receiver is the argument of the module's class type.
  const size_t first =
      !formal.empty() && (formal[0].name() == "self" || formal[0].type()->kind() == c10::TypeKind::ClassType) ? 1 : 0;
  const size_t n = formal.size() - first;
  std::vector<std::optional<c10::IValue>> bound(n);
  auto describe = [&](size_t i) { return "'" + formal[first + i].name() + "' (" + type_text(formal[first + i].type()) + ")"; };

  size_t next = 0;
  for (auto& t : tensors) {
    if (next >= n)
      fail(method, "takes " + std::to_string(n) + " argument(s), given " + std::to_string(tensors.size()) + " --input");
    if (!takes_tensor(formal[first + next].type()))
      fail(method, "argument " + describe(next) + " is not a Tensor: give it with --arg");
    bound[next++] = std::move(t);
  }
  // Positional values first, as Python binds a call: a name then fills a slot they left.
  std::vector<const arg_spec*> ordered;
  for (const auto& a : args)
    if (a.name.empty()) ordered.push_back(&a);
  for (const auto& a : args)
    if (!a.name.empty()) ordered.push_back(&a);
  for (const arg_spec* ap : ordered) {
    const arg_spec& a = *ap;
    size_t i;
    if (a.name.empty()) {
      if (next >= n) fail(method, "too many arguments: it takes " + std::to_string(n) + ", '" + a.text + "' is one more");
      i = next++;
    } else {
      i = n;
      for (size_t k = 0; k < n; ++k)
        if (formal[first + k].name() == a.name) i = k;
      if (i == n) {
        std::string names;
        for (size_t k = 0; k < n; ++k) names += (k ? ", " : "") + formal[first + k].name();
        fail(method, "no argument named '" + a.name + "' (it takes: " + (names.empty() ? "none" : names) + ")");
      }
      if (bound[i]) fail(method, "argument '" + a.name + "' given twice");
    }
    const c10::Argument& f = formal[first + i];
    auto v = parse_value(f.type(), a.text, method, f.name());
    if (!v) fail(method, "argument " + describe(i) + ": '" + a.text + "' is not a valid " + type_text(f.type()));
    bound[i] = std::move(*v);
  }
  std::vector<c10::IValue> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!bound[i]) {
      const auto& d = formal[first + i].default_value();
      if (!d) fail(method, "missing argument " + describe(i) + (takes_tensor(formal[first + i].type()) ? ": give it with --input" : ": give it with --arg"));
      bound[i] = *d;
    }
    out.push_back(std::move(*bound[i]));
  }
  return out;
}

bound_call bind_call(const torch::jit::Module& root, const std::string& name, const std::vector<c10::IValue>& tensors,
                     const std::vector<arg_spec>& args) {
  // "blocks.0.attn.forward": the submodule path, then the method.
  torch::jit::Module m = root;
  std::string meth = name;
  size_t dot = name.rfind('.');
  if (dot != std::string::npos) {
    meth = name.substr(dot + 1);
    size_t start = 0;
    while (start < dot) {
      size_t next = name.find('.', start);
      if (next > dot) next = dot;
      std::string part = name.substr(start, next - start);
      if (part.empty() || !m.hasattr(part) || !m.attr(part).isModule())
        throw error(errc::usage, "method " + name + ": the module has no submodule '" + name.substr(0, next) + "'");
      m = m.attr(part).toModule();
      start = next + 1;
    }
  }
  std::vector<torch::jit::Method> candidates;
  if (auto direct = m.find_method(meth)) {
    candidates.push_back(*direct);
  } else {
    const std::string prefix = meth + "__";
    for (const auto& cand : m.get_methods()) {
      const std::string& mn = cand.name();
      if (mn.size() > prefix.size() && mn.compare(0, prefix.size(), prefix) == 0 &&
          mn.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
        candidates.push_back(cand);
    }
  }
  if (candidates.empty()) {
    std::string names;
    for (const auto& cand : m.get_methods()) names += (names.empty() ? "" : ", ") + cand.name();
    throw error(errc::usage, "the module has no method '" + name + "' (it has: " +
                                 (names.empty() ? std::string("none") : names) + ")");
  }
  std::optional<error> first_failure;
  for (auto& cand : candidates) {
    try {
      return {cand, bind_arguments(cand.function().getSchema(), name, tensors, args)};
    } catch (const error& e) {
      if (!first_failure) first_failure = e;
    }
  }
  throw *first_failure;
}

}  // namespace ckpt::detail
