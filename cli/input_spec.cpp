#include "input_spec.h"

#include <cctype>

#include "ckpt/error.h"

namespace cli {

// "4x5:int64", "3x224x224" (float32), "():float64" for a 0-d tensor.
ckpt::input_spec parse_input_spec(const std::string& spec) {
  ckpt::input_spec in;
  std::string shape = spec;
  size_t colon = spec.rfind(':');
  if (colon != std::string::npos) {
    shape = spec.substr(0, colon);
    auto t = ckpt::dtype_from_name(spec.substr(colon + 1));
    if (!t) throw ckpt::error(ckpt::errc::usage, "--input " + spec + ": unknown dtype '" + spec.substr(colon + 1) + "'");
    in.type = *t;
  }
  if (shape == "()" || shape.empty()) return in;
  size_t start = 0;
  while (start <= shape.size()) {
    size_t x = shape.find_first_of("x,", start);
    std::string dim = shape.substr(start, x == std::string::npos ? std::string::npos : x - start);
    if (dim.empty() || dim.find_first_not_of("0123456789") != std::string::npos || dim.size() > 18)
      throw ckpt::error(ckpt::errc::usage, "--input " + spec + ": expected a shape like 4x5 or 4x5:int64");
    in.shape.push_back(std::stoll(dim));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  return in;
}

ckpt::arg_spec parse_arg_spec(const std::string& spec) {
  size_t eq = spec.find('=');
  if (eq != std::string::npos && eq > 0) {
    std::string name = spec.substr(0, eq);
    bool ident = !std::isdigit(static_cast<unsigned char>(name[0]));
    for (char ch : name) ident = ident && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_');
    if (ident) return {name, spec.substr(eq + 1)};
  }
  return {"", spec};
}

}  // namespace cli
