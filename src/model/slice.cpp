#include "ckpt/slice.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "model/slice_match.h"
#include "report/json_input.h"

namespace ckpt {
namespace {

[[noreturn]] void bad_placement(std::string_view text, const std::string& what) {
  throw error(errc::usage, what + ": '" + std::string(text) +
                               "' is not a placement (expected Shard(D), Replicate() or Range(D, START, LENGTH))");
}

// Integers of an argument list "a, b=c, -d": keyword names are accepted only as `allowed`
// says, in order (DTensor prints Shard(dim=0)).
std::vector<int64_t> parse_args(std::string_view body, const std::vector<std::string>& names, std::string_view text,
                                const std::string& what) {
  std::vector<int64_t> out;
  size_t at = 0;
  if (body.empty()) return out;
  while (true) {
    size_t comma = body.find(',', at);
    std::string_view arg = body.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    const size_t eq = arg.find('=');
    if (eq != std::string_view::npos) {
      if (out.size() >= names.size() || arg.substr(0, eq) != names[out.size()]) bad_placement(text, what);
      arg = arg.substr(eq + 1);
    }
    size_t i = 0;
    bool negative = false;
    if (i < arg.size() && (arg[i] == '-' || arg[i] == '+')) negative = arg[i++] == '-';
    if (i == arg.size()) bad_placement(text, what);
    int64_t v = 0;
    for (; i < arg.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(arg[i]))) bad_placement(text, what);
      const int digit = arg[i] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10)
        throw error(errc::usage, what + ": '" + std::string(text) + "' holds a number past 2^63 - 1");
      v = v * 10 + digit;
    }
    out.push_back(negative ? -v : v);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

placement parse_placement(std::string_view raw, const std::string& what) {
  std::string text;
  for (char ch : raw)
    if (!std::isspace(static_cast<unsigned char>(ch))) text += ch;
  placement p;
  if (text == "Replicate" || text == "Replicate()") return p;
  const size_t open = text.find('(');
  if (open == std::string::npos || text.back() != ')') bad_placement(raw, what);
  const std::string name = text.substr(0, open);
  const std::string_view body = std::string_view(text).substr(open + 1, text.size() - open - 2);
  if (name == "Shard") {
    std::vector<int64_t> a = parse_args(body, {"dim"}, raw, what);
    if (a.size() != 1) bad_placement(raw, what);
    p.type = placement::kind::shard;
    p.dim = a[0];
    return p;
  }
  if (name == "Range") {
    std::vector<int64_t> a = parse_args(body, {"dim", "start", "length"}, raw, what);
    if (a.size() != 3 || a[1] < 0 || a[2] < 0) bad_placement(raw, what);
    p.type = placement::kind::range;
    p.dim = a[0];
    p.start = a[1];
    p.length = a[2];
    return p;
  }
  bad_placement(raw, what);
}

std::string placement_text(const placement& p) {
  switch (p.type) {
    case placement::kind::replicate: return "Replicate()";
    case placement::kind::shard: return "Shard(" + std::to_string(p.dim) + ")";
    case placement::kind::range:
      return "Range(" + std::to_string(p.dim) + ", " + std::to_string(p.start) + ", " + std::to_string(p.length) + ")";
  }
  return "";
}

dim_range chunk_range(int64_t size, int64_t rank, int64_t world) {
  // torch.chunk: every chunk but the last has ceil(size / world) elements, so fewer than
  // `world` chunks may exist (chunk(5, 4) is 2, 2, 1); DTensor gives the ranks past them
  // empty shards that start at the end of the dimension.
  // ceil(size / world) and its multiples in 128 bits: size + world - 1 and full * rank
  // overflow int64 for a world near 2^63.
  const int64_t full = world > 0 ? size / world + (size % world != 0) : size;
  const __int128 start = __int128(full) * rank;
  if (start >= size) return {size, 0};
  return {int64_t(start), std::min<int64_t>(size - int64_t(start), full)};
}

std::vector<dim_range> slice_box(const placement& p, const std::vector<int64_t>& shape, int64_t rank, int64_t world,
                                 const std::string& what) {
  std::vector<dim_range> box;
  for (int64_t n : shape) box.push_back({0, n});
  if (p.type == placement::kind::replicate) return box;
  const int64_t rank_count = int64_t(shape.size());
  const int64_t d = p.dim < 0 ? p.dim + rank_count : p.dim;
  if (d < 0 || d >= rank_count)
    throw error(errc::usage, what + ": " + placement_text(p) + " names dimension " + std::to_string(p.dim) +
                                 " of a tensor of " + std::to_string(rank_count) + " dimensions");
  if (p.type == placement::kind::shard) {
    box[size_t(d)] = chunk_range(shape[size_t(d)], rank, world);
    return box;
  }
  if (p.start > shape[size_t(d)] || p.length > shape[size_t(d)] - p.start)
    throw error(errc::usage, what + ": " + placement_text(p) + " lies outside dimension " + std::to_string(d) +
                                 " of size " + std::to_string(shape[size_t(d)]));
  box[size_t(d)] = {p.start, p.length};
  return box;
}

detail::selection_matcher::selection_matcher(const slice_selection& sel) {
  rules_.reserve(sel.rules.size());
  for (const auto& [pattern, p] : sel.rules) rules_.emplace_back(text::glob(pattern), p);
}

std::optional<placement> detail::selection_matcher::match(std::string_view key) const {
  for (const auto& [glob, p] : rules_)
    if (glob.matches(key)) return p;
  return std::nullopt;
}

std::optional<placement> slice_selection::match(std::string_view key) const {
  return detail::selection_matcher(*this).match(key);
}

std::function<bool(const std::string&, const dim_list&, const dim_list&, const dim_list&)> chunks_met_by(
    const slice_selection& sel) {
  return [sel, matcher = detail::selection_matcher(sel)](const std::string& key, const dim_list& shape,
                                                         const dim_list& offsets, const dim_list& sizes) {
    const std::optional<placement> p = matcher.match(key);
    if (!p) return false;
    if (offsets.size() != shape.size() || sizes.size() != shape.size()) return true;  // the open reports it
    std::vector<dim_range> box;
    try {
      box = slice_box(*p, std::vector<int64_t>(shape.begin(), shape.end()), sel.rank, sel.world, key);
    } catch (const error&) {
      return true;
    }
    // Met when the ranges overlap in every dimension (a 0-dim tensor: always).
    for (size_t d = 0; d < box.size(); ++d) {
      const int64_t lo = std::max(box[d].start, offsets[d]);
      const int64_t hi = std::min(box[d].start + box[d].length, offsets[d] + sizes[d]);
      if (hi <= lo) return false;
    }
    return true;
  };
}

namespace {

void check_rank(int64_t rank, int64_t world) {
  if (world < 1) throw error(errc::usage, "--world " + std::to_string(world) + ": expected at least 1");
  // torch.distributed's world size is a C int.
  if (world > std::numeric_limits<int32_t>::max())
    throw error(errc::usage, "--world " + std::to_string(world) + ": expected at most " +
                                 std::to_string(std::numeric_limits<int32_t>::max()));
  if (rank < 0 || rank >= world)
    throw error(errc::usage, "--rank " + std::to_string(rank) + ": expected 0 to " + std::to_string(world - 1) +
                                 " for a world of " + std::to_string(world));
}

}  // namespace

slice_selection parse_slice_plan(const std::string& json_text, const std::string& what, int64_t rank, int64_t world) {
  check_rank(rank, world);
  // Order matters (first match wins), so the object is read in the order written, and a
  // glob given twice is refused rather than one of the two silently kept.
  (void)parse_json_unique_keys(json_text, what);
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::usage, what + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object() || doc.empty())
    throw error(errc::usage, what + ": expected a non-empty JSON object from key glob to placement string");
  slice_selection s;
  s.rank = rank;
  s.world = world;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (!it.value().is_string())
      throw error(errc::usage, what + ": the value of '" + it.key() + "' is not a placement string");
    s.rules.emplace_back(it.key(), parse_placement(it.value().get<std::string>(), what + " '" + it.key() + "'"));
  }
  return s;
}

std::optional<slice_selection> slice_preset(std::string_view name, int64_t rank, int64_t world) {
  if (name != "llama-tp") return std::nullopt;
  check_rank(rank, world);
  // Megatron's and vLLM's layout (docs/formats.md §16.4): column-parallel projections split
  // their output features (dim 0 of the [out, in] weight, and their bias), row-parallel ones
  // their input features (dim 1; their bias is added after the reduction, so replicated);
  // the embedding and the LM head split the vocabulary.
  const placement row{placement::kind::shard, 0}, column{placement::kind::shard, 1}, whole{};
  slice_selection s;
  s.rank = rank;
  s.world = world;
  for (const char* p : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}) {
    s.rules.emplace_back(std::string("*") + p + ".weight", row);
    s.rules.emplace_back(std::string("*") + p + ".bias", row);
  }
  s.rules.emplace_back("*o_proj.weight", column);
  s.rules.emplace_back("*down_proj.weight", column);
  s.rules.emplace_back("*embed_tokens.weight", row);
  s.rules.emplace_back("*lm_head.weight", row);
  s.rules.emplace_back("*", whole);
  return s;
}

}  // namespace ckpt
