// JSON documents ckptool reads from users (the --map key map): nlohmann's parser keeps the
// last of two equal keys without a word, so a map could say one thing to a reviewer and
// another to ckptool. Here a duplicate key in any object is an error naming it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ckpt {

/// Parses `text`; throws errc::usage "WHAT is not valid JSON: ..." or "WHAT has the key
/// 'K' twice in one object".
nlohmann::json parse_json_unique_keys(const std::string& text, const std::string& what);

}  // namespace ckpt
