#include "ckpt/report.h"

#include <array>
#include <map>

#include "ckpt/wrappers.h"

namespace ckpt {

nlohmann::json path_json(const value_path& path) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& step : path) {
    if (const auto* s = std::get_if<std::string>(&step))
      out.push_back(*s);
    else
      out.push_back(std::get<int64_t>(step));
  }
  return out;
}

std::vector<std::string> tensor_keys(const checkpoint& c) {
  std::vector<std::string> keys;
  if (c.state_dict) {
    for (auto& [key, index] : c.state_dict_tensors()) keys.push_back(key);
  } else {
    for (const auto& t : c.tensors) keys.push_back(path_to_string(t.path));
  }
  return keys;
}

nlohmann::json inspect_json(const checkpoint& c) {
  using nlohmann::json;
  json doc;
  doc["schema"] = kInspectSchemaVersion;
  doc["file"] = c.path;
  doc["file_size"] = c.file_size;
  doc["format"] = format_name(c.format);
  doc["io"] = {{"bytes_read", c.source ? c.source->bytes_read() : 0}};
  doc["state_dict"] = c.state_dict ? path_json(*c.state_dict) : json(nullptr);
  doc["lightning"] = c.lightning;
  doc["byteorder"] = c.byteorder;

  json tensors = json::array();
  uint64_t total_numel = 0, total_bytes = 0;
  std::map<std::string, std::array<uint64_t, 3>> by_dtype;
  for (const auto& t : c.tensors) {
    json j;
    j["path"] = path_json(t.path);
    j["dtype"] = name(t.type);
    j["shape"] = t.shape;
    j["stride"] = t.stride;
    j["storage_offset"] = t.storage_offset;
    j["storage"] = t.storage ? json(c.storages[*t.storage].key) : json(nullptr);
    j["nbytes"] = t.nbytes();
    j["parameter"] = t.parameter;
    j["requires_grad"] = t.requires_grad;
    j["device"] = t.location;
    tensors.push_back(std::move(j));
    total_numel += t.numel();
    total_bytes += t.nbytes();
    auto& row = by_dtype[name(t.type)];
    row[0] += 1;
    row[1] += t.numel();
    row[2] += t.nbytes();
  }
  doc["tensors"] = std::move(tensors);

  json aliases = json::array();
  for (const auto& a : c.aliases)
    aliases.push_back({{"path", path_json(a.path)}, {"same_as", path_json(c.tensors[a.tensor].path)}});
  doc["aliases"] = std::move(aliases);

  json storages = json::array();
  for (const auto& s : c.storages) {
    storages.push_back({{"key", s.key},
                        {"dtype", name(s.type)},
                        {"nbytes", s.nbytes},
                        {"offset", s.file_offset ? json(*s.file_offset) : json(nullptr)},
                        {"device", s.location},
                        {"tensors", s.tensor_count}});
  }
  doc["storages"] = std::move(storages);

  json wrappers = json::object();
  for (auto& [segment, count] : count_wrappers(tensor_keys(c))) wrappers[segment] = count;
  doc["wrappers"] = std::move(wrappers);
  doc["unsafe_globals"] = c.unsafe_globals;
  doc["globals"] = c.globals;

  json entries = json::array();
  for (const auto& e : c.entries)
    entries.push_back({{"path", path_json(e.path)}, {"type", e.type}, {"value", e.value}});
  doc["entries"] = std::move(entries);

  json dtypes = json::object();
  for (auto& [dt, row] : by_dtype) dtypes[dt] = {{"tensors", row[0]}, {"numel", row[1]}, {"nbytes", row[2]}};
  doc["totals"] = {{"tensors", c.tensors.size()},
                   {"numel", total_numel},
                   {"nbytes", total_bytes},
                   {"by_dtype", std::move(dtypes)}};
  return doc;
}

}  // namespace ckpt
