#include "formats/dcp_sharding_info.h"

#include <nlohmann/json.hpp>

#include "ckpt/error.h"

namespace ckpt::dcp {
namespace {

[[noreturn]] void corrupt(const std::string& why) {
  throw error(errc::corrupt, std::string("__metadata__ ") + kShardingInfoKey + " " + why);
}

}  // namespace

sharding_info parse_sharding_info(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) corrupt("is not JSON");
  if (!j.is_object()) corrupt("is not a JSON object");
  sharding_info out;
  out.offsets.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& fqn = it.key();
    const nlohmann::json& entry = it.value();
    if (!entry.is_object() || !entry.contains("saved_offsets"))
      corrupt("entry for '" + fqn + "' has no saved_offsets");
    const nlohmann::json& offs = entry["saved_offsets"];
    if (!offs.is_array()) corrupt("saved_offsets of '" + fqn + "' is not a list");
    std::vector<int64_t> v;
    v.reserve(offs.size());
    for (const nlohmann::json& o : offs) {
      if (!o.is_number_integer()) corrupt("saved_offsets of '" + fqn + "' holds a non-integer");
      if (o.is_number_unsigned() ? o.get<uint64_t>() > uint64_t(INT64_MAX) : o.get<int64_t>() < 0)
        corrupt("saved_offsets of '" + fqn + "' holds an offset out of range");
      v.push_back(o.get<int64_t>());
    }
    out.offsets[fqn] = std::move(v);
  }
  return out;
}

std::optional<std::string_view> metadata_value(const std::vector<std::pair<std::string, std::string>>& metadata,
                                               std::string_view key) {
  for (const auto& [k, v] : metadata)
    if (k == key) return std::string_view(v);
  return std::nullopt;
}

}  // namespace ckpt::dcp
