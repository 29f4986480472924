#include "validators.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "ckpt/dtype.h"
#include "base/text_escape.h"

namespace cli {
namespace {

std::string shown(const std::string& value) { return "'" + ckpt::escape_controls(value) + "'"; }

bool all_digits(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

}  // namespace

CLI::Validator limit_value(uint64_t max) {
  return CLI::Validator(
      [max](std::string& s) -> std::string {
        // Twenty digits hold every uint64_t; more cannot be a sane limit anyway.
        if (all_digits(s) && s.size() <= 20) {
          errno = 0;
          unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
          if (errno == 0 && v <= max) return {};
        }
        return "expected a whole number from 0 to " + std::to_string(max) + ", got " + shown(s);
      },
      "0.." + std::to_string(max));
}

CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (all_digits(s) && s.size() <= 3 && std::stoi(s) >= 1 && std::stoi(s) <= 256) return {};
        return "expected 1 to 256 threads, got " + shown(s) + " (leave the flag out for the default)";
      },
      "1..256");
}

CLI::Validator device_name() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s == "cpu" || s == "meta" || s == "cuda") return {};
        if (s.rfind("cuda:", 0) == 0 && all_digits(s.substr(5)) && s.size() <= 5 + 4) return {};
        return "unsupported device " + shown(s) + " (expected cpu, meta, cuda or cuda:N)";
      },
      "");
}

CLI::Validator floating_dtype() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        auto t = ckpt::dtype_from_name(s);
        if (t && ckpt::info(*t).is_floating) return {};
        std::string valid;
        for (size_t i = 0; i <= static_cast<size_t>(ckpt::dtype::bits4x2); ++i) {
          const auto& row = ckpt::info(static_cast<ckpt::dtype>(i));
          if (row.is_floating) valid += (valid.empty() ? "" : ", ") + std::string(row.name);
        }
        return "expected a floating dtype (" + valid + "), got " + shown(s);
      },
      "");
}

CLI::Validator tolerance() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        // Decimal only: strtod alone would take "0x1p-3", " 1" and "infinity" too.
        const bool decimal = !s.empty() && s.find_first_not_of("0123456789.eE+-") == std::string::npos &&
                             s.find_first_of("0123456789") != std::string::npos;
        char* end = nullptr;
        errno = 0;
        const double v = decimal ? std::strtod(s.c_str(), &end) : 0;
        // Underflow (1e-400, 4e-320) is a number still, as Python reads it (0.0, a subnormal):
        // only overflow, which isfinite catches, is refused.
        if (!decimal || *end != '\0' || !std::isfinite(v) || v < 0)
          return "expected a finite number >= 0, got '" + s + "'";
        return "";
      },
      "TOL");
}

CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& s) -> std::string {
        // 19 digits may pass INT64_MAX: compared as text first.
        const bool fits = all_digits(s) && (s.size() < 19 || (s.size() == 19 && s <= "9223372036854775807"));
        if (fits && std::stoll(s) >= min && std::stoll(s) <= max) return {};
        return "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", got " + shown(s);
      },
      "INT");
}

CLI::Validator non_empty_path() {
  return CLI::Validator([](std::string& s) -> std::string { return s.empty() ? "expected a path, got ''" : ""; }, "");
}

}  // namespace cli
