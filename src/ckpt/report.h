// The inspect report as data: the CLI prints it as a table or as JSON (docs/inspect-json.md).
#pragma once

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"

namespace ckpt {

constexpr int kInspectSchemaVersion = 1;

/// The JSON document of `ckptool inspect --json`, without the TorchScript "module" part
/// (added by the caller that has LibTorch).
nlohmann::json inspect_json(const checkpoint& c);

/// A path as JSON: strings and integers.
nlohmann::json path_json(const value_path& path);

/// State-dict keys of `c` (or every tensor's path string when no state dict was found).
std::vector<std::string> tensor_keys(const checkpoint& c);

}  // namespace ckpt

namespace ckpt {

/// Serializes `doc` as JSON text. Strings from pickles may hold lone surrogates (kept as
/// WTF-8, as CPython keeps them in str); they come out as "\udcXX" escapes, which is how
/// Python's json module writes such strings, instead of being replaced.
std::string json_text(const nlohmann::json& doc, int indent = 2);

}  // namespace ckpt
