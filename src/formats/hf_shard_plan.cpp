#include "formats/hf_shard_plan.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include "base/text.h"
#include "ckpt/error.h"

namespace ckpt::hf {
namespace {

// str.strip()'s ASCII whitespace: \t \n \v \f \r, \x1c-\x1f and space.
bool py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

std::string_view strip(std::string_view s) {
  while (!s.empty() && py_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && py_space(s.back())) s.remove_suffix(1);
  return s;
}

bool digit(char c) { return c >= '0' && c <= '9'; }

[[noreturn]] void bad_size(std::string_view text, const std::string& why) {
  throw error(errc::usage, "max shard size " + text::quote(text) + ": " + why);
}

}  // namespace

uint64_t parse_max_shard_size(std::string_view text) {
  const std::string_view s = strip(text);
  if (s.size() < 2) bad_size(text, "expected a number and a unit (KB, MB, GB, TB)");
  std::string unit(s.substr(s.size() - 2));
  for (char& c : unit)
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  double multiplier = 0;
  if (unit == "KB") multiplier = 1e3;
  else if (unit == "MB") multiplier = 1e6;
  else if (unit == "GB") multiplier = 1e9;
  else if (unit == "TB") multiplier = 1e12;
  else bad_size(text, "unit '" + unit + "' is not one of KB, MB, GB, TB");

  // float(): an optional sign, digits (one '_' allowed between two digits), an optional
  // fraction and exponent. inf and nan are refused (the Hub fails on them too, later).
  const std::string_view v = strip(s.substr(0, s.size() - 2));
  std::string number;
  for (size_t i = 0; i < v.size(); ++i) {
    const char c = v[i];
    if (c == '_' && i > 0 && i + 1 < v.size() && digit(v[i - 1]) && digit(v[i + 1])) continue;
    if (!digit(c) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-')
      bad_size(text, "not a decimal number");
    number += c;
  }
  if (number.empty()) bad_size(text, "no number");
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) bad_size(text, "not a decimal number");
  if (value < 0) bad_size(text, "negative");
  // int(value * multiplier): one IEEE product, truncated, as Python does it.
  const double bytes = value * multiplier;
  if (!(bytes < 18446744073709551616.0)) return UINT64_MAX;
  return uint64_t(bytes);
}

shard_plan plan_shards(const std::vector<shard_tensor>& tensors, uint64_t max_shard_size, std::string_view pattern) {
  const size_t at = pattern.find("{suffix}");
  const std::string prefix(pattern.substr(0, at == std::string_view::npos ? 0 : at));
  const std::string tail(at == std::string_view::npos ? std::string_view() : pattern.substr(at + 8));
  if (at == std::string_view::npos || prefix.find_first_of("{}") != std::string::npos ||
      tail.find_first_of("{}") != std::string::npos)
    throw error(errc::usage, "shard file pattern " + text::quote(pattern) + " must hold '{suffix}' once and no other brace");

  std::unordered_set<std::string_view> keys;
  for (const auto& t : tensors)
    if (!keys.insert(t.key).second) throw error(errc::usage, "tensor key " + text::quote(t.key) + " given twice");

  shard_plan plan;
  // _base.py split_state_dict_into_shards_factory, step by step.
  std::unordered_map<uint64_t, size_t> group_of;  // storage id -> index in `groups`
  std::vector<std::vector<size_t>> groups;        // in order of first appearance
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (t.storage) {
      auto [it, fresh] = group_of.emplace(*t.storage, groups.size());
      if (!fresh) {
        groups[it->second].push_back(i);  // placed with its first tensor below
        continue;
      }
      groups.push_back({i});
    }
    const uint64_t size = t.storage_nbytes;
    // Bigger than the limit: a shard of its own, listed before the shard being filled.
    if (size > max_shard_size) {
      plan.total_size += size;
      shards.push_back({i});
      continue;
    }
    if (current_size + size > max_shard_size) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += size;
    plan.total_size += size;
  }
  if (!current.empty()) shards.push_back(std::move(current));

  constexpr size_t none = SIZE_MAX;
  plan.file_of.assign(tensors.size(), none);
  for (size_t s = 0; s < shards.size(); ++s)
    for (size_t i : shards[s]) plan.file_of[i] = s;
  for (const auto& g : groups) {
    const size_t s = plan.file_of[g.front()];
    for (size_t k = 1; k < g.size(); ++k) {
      shards[s].push_back(g[k]);
      plan.file_of[g[k]] = s;
    }
  }

  const size_t n = shards.size();
  for (size_t s = 0; s < n; ++s) {
    std::string suffix;
    if (n > 1) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu", s + 1, n);
      suffix = buf;
    }
    plan.files.push_back(prefix + suffix + tail);
  }
  plan.file_tensors = std::move(shards);
  return plan;
}

}  // namespace ckpt::hf
