// Hugging Face shard sets: the `*.index.json` that names, for every tensor, the shard file
// holding it (formats.md §10), and the cross-check of an index against what its shards
// really hold. Pure functions over text and key lists: opening the shards and listing the
// directory are the caller's (the file opener's) business, so the same rules run over real
// directories, in-memory sets and fuzz inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ckpt::hf {

/// Bounds on what one index may cost. The largest public indexes (hundreds of thousands
/// of keys) are a few tens of MB; these leave room while keeping a hostile file bounded.
struct index_limits {
  uint64_t max_bytes = 256ull << 20;
  size_t max_keys = 4'000'000;
  size_t max_shards = 1'000'000;
  size_t max_name = 4096;  // one shard file name, in bytes (PATH_MAX)
};

struct index {
  index() = default;
  index(index&&) = default;
  index& operator=(index&&) = default;
  index(const index&) = delete;  // by_key views the strings of `keys`
  index& operator=(const index&) = delete;

  /// Distinct shard names, sorted: the order transformers and accelerate open them in
  /// (sorted(set(weight_map.values()))), which is shard-number order for the writers' names.
  std::vector<std::string> shards;
  /// weight_map in file order: key -> position in `shards`.
  std::vector<std::pair<std::string, uint32_t>> keys;
  /// metadata.total_size and metadata.total_parameters when present as byte/element counts.
  std::optional<uint64_t> total_size;
  std::optional<uint64_t> total_parameters;
  bool has_metadata = false;
  /// Things a loader tolerates but a reader should be told about (one line each).
  std::vector<std::string> notes;

  /// The shard holding `key`, or nullptr.
  const std::string* shard_of(std::string_view key) const;

  std::unordered_map<std::string_view, uint32_t> by_key;  // views into `keys` -> position in `shards`
};

/// Parses an index (a caller reading it from a file should stop at limits.max_bytes + 1
/// bytes rather than read a hostile file whole). Throws ckpt::error: corrupt (not JSON, a key twice in one object, no
/// `weight_map` object, a value that is not a string, an empty weight_map), unsafe (a shard
/// name ckpt::relative_name_problem refuses: absolute, `..`, a drive, NUL, ...) or limit.
/// The error does not name the file: the caller adds it with error::with_file.
index parse_index(std::string_view text, const index_limits& limits = {});

/// parse_index's shards alone (`shards`, `total_size`, `total_parameters`, `notes`; `keys`
/// and `by_key` left empty), for listing a set's files: every check of parse_index but the
/// one for a key named twice in weight_map, which parse_index (the set's reader) reports.
index parse_index_shards(std::string_view text, const index_limits& limits = {});

/// What one shard file holds, as the caller read it.
struct shard_contents {
  std::string name;               // as the index spells it (or as listed, for extra files)
  bool present = true;            // false: the file does not exist
  std::vector<std::string> keys;  // the tensor names it holds
  uint64_t bytes = 0;             // its tensor bytes as total_size counts them (storage bytes)
};

struct finding {
  enum class what {
    missing_shard,           // error: the index names a file that does not exist
    key_missing_from_shard,  // error: the index names a key its shard does not hold
    key_in_two_shards,       // error: two of the index's shards hold the same key
    key_not_in_index,        // warning: a shard of the index holds a key the index omits
    orphan_shard,            // warning: a shard file next to the index that it never names
    total_size_mismatch,     // warning: metadata.total_size differs from the shards' bytes
    no_total_size,           // warning: no metadata.total_size (or no metadata at all)
  };
  what kind;
  bool error = false;
  std::string key;    // the tensor key, when the finding is about one
  std::string shard;  // the shard file it is about
  std::string other;  // the second shard (key_in_two_shards)
  std::string message;
};

struct cross_check_result {
  std::vector<finding> findings;  // errors and warnings, in index order
  size_t errors() const;
  size_t warnings() const { return findings.size() - errors(); }
};

/// The rules of formats.md §10.3. `shards` holds one entry per shard of the index (in any
/// order; a shard of the index with no entry counts as missing) plus any other file the
/// caller found beside it (orphan_candidates).
cross_check_result cross_check(const index& idx, const std::vector<shard_contents>& shards);

/// Files in a directory listing that look like shards of this index but are not named by
/// it: same extension as one of its shards (".safetensors", ".bin"), not the index itself.
std::vector<std::string> orphan_candidates(const index& idx, const std::vector<std::string>& listing);

}  // namespace ckpt::hf
