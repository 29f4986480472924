// The inspect report as data: the CLI prints it as a table or as JSON (docs/inspect-json.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"

namespace ckpt {

constexpr int kInspectSchemaVersion = 1;

/// What the caller of write_inspect_json adds to the document.
struct inspect_json_options {
  /// Further top-level members ("ckptool_version"; TorchScript's "module" and "outputs",
  /// which need LibTorch), placed in key order; one named like a built-in member replaces it.
  nlohmann::json extra = nlohmann::json::object();
  /// Bytes the caller read from the file itself, added to "io"."bytes_read".
  uint64_t extra_bytes_read = 0;
  /// When set, only the tensors it accepts are listed and counted in "filtered_totals";
  /// "totals" still counts every tensor.
  std::function<bool(const tensor_record&)> keep_tensor;
  /// 2: laid out as dump(2); -1: compact, as dump() (a DCP directory of 80,000 chunks is
  /// 81 MB indented, 47 MB without the whitespace).
  int indent = 2;
};

/// Writes the JSON document of `ckptool inspect --json` (docs/inspect-json.md) to `sink` in
/// pieces, without a trailing newline. The text is what nlohmann's dump(options.indent)
/// (through json_text) would print for the same document, but the tensor and storage tables, which
/// can hold 100,000 rows, are never built as a tree.
void write_inspect_json(const checkpoint& c, const inspect_json_options& options,
                        const std::function<void(std::string_view)>& sink);

/// Writes the object `doc` as json_text(doc) prints it (without a trailing newline), with one
/// more member, `key`, holding [{"new": new, "old": old}, ...] for `pairs` (old, new): a
/// million renamed keys are written in pieces, never built as a tree (rekey --json).
void write_json_with_pairs(const nlohmann::json& doc, std::string_view key,
                           const std::vector<std::pair<std::string, std::string>>& pairs,
                           const std::function<void(std::string_view)>& sink);

/// State-dict keys of `c` (or every tensor's path string when no state dict was found).
std::vector<std::string> tensor_keys(const checkpoint& c);

/// Serializes `doc` as JSON text. Strings from pickles may hold lone surrogates (kept as
/// WTF-8, as CPython keeps them in str); they come out as "\udcXX" escapes, which is how
/// Python's json module writes such strings, instead of being replaced.
std::string json_text(const nlohmann::json& doc, int indent = 2);

}  // namespace ckpt
