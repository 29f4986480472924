// How huggingface_hub (2.4.0) splits a state dict into safetensors shards:
// `split_torch_state_dict_into_shards`, reproduced exactly so that `convert --to hf` names
// the same files and puts each key in the same one (formats.md §10.5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::hf {

struct shard_tensor {
  std::string key;
  /// Tensors with the same id share a storage: counted once, kept in one shard. nullopt
  /// never shares (what the Hub gives a meta tensor). The Hub's id is (device, storage
  /// data pointer, storage bytes), and every empty storage has data pointer 0: the caller
  /// gives all zero-byte storages of one device one id to match it.
  std::optional<uint64_t> storage;
  /// The whole storage's bytes (a view counts its storage), as get_torch_storage_size.
  uint64_t storage_nbytes = 0;
};

struct shard_plan {
  /// File names in shard order: "model-00001-of-00003.safetensors", ...; one shard is
  /// "model.safetensors"; an empty state dict has none.
  std::vector<std::string> files;
  /// Per file, the indices of its tensors in the order the Hub lists them (state-dict
  /// order, then the tensors that share a storage with one of them, appended).
  std::vector<std::vector<size_t>> file_tensors;
  /// Per tensor (the caller's index): its file's index in `files`.
  std::vector<size_t> file_of;
  /// The index's metadata.total_size: each storage's bytes once.
  uint64_t total_size = 0;
  /// More than one file: the Hub then writes an index.
  bool is_sharded() const { return files.size() > 1; }
};

/// parse_size_to_int: "5GB", " 1.5 mb ", "20KB", "2e3MB" -> bytes, decimal units (KB, MB,
/// GB, TB, any case), int(float(value) * unit) as Python computes it. Throws errc::usage
/// for what the Hub refuses (other units, no number) and, stricter than the Hub, for a
/// negative size, inf/nan, and non-ASCII whitespace. A size past 2^64-1 is taken as 2^64-1.
uint64_t parse_max_shard_size(std::string_view text);

/// The Hub's default, "5GB".
constexpr uint64_t kDefaultMaxShardSize = 5'000'000'000ULL;

/// split_state_dict_into_shards_factory with the torch storage rules. `pattern` holds
/// "{suffix}" once and no other brace (errc::usage otherwise); the Hub's default is
/// "model{suffix}.safetensors". Two tensors with one key: errc::usage.
shard_plan plan_shards(const std::vector<shard_tensor>& tensors, uint64_t max_shard_size,
                       std::string_view pattern = "model{suffix}.safetensors");

}  // namespace ckpt::hf
