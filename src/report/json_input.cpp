#include "report/json_input.h"

#include <set>
#include <vector>

#include "ckpt/error.h"

namespace ckpt {

nlohmann::json parse_json_unique_keys(const std::string& text, const std::string& what) {
  using event = nlohmann::json::parse_event_t;
  // One set of keys per object being parsed, innermost last. The callback sees every key
  // before its value, so the set of an object is complete when a duplicate arrives.
  std::vector<std::set<std::string>> open;
  auto check = [&](int /*depth*/, event e, nlohmann::json& parsed) {
    if (e == event::object_start) {
      open.emplace_back();
    } else if (e == event::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (e == event::key && !open.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open.back().insert(key).second)
        throw error(errc::usage, what + " has the key '" + key + "' twice in one object");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::usage, what + " is not valid JSON: " + e.what());
  }
}

}  // namespace ckpt
