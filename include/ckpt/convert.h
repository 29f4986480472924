// `ckptool convert`: the state dict of any checkpoint ckptool reads (one file, a Hugging
// Face shard set, a DCP directory) written as one torch.save zip, one safetensors file, a
// Hugging Face shard set or a DCP directory laid out for K ranks (formats.md §13, §9.9). Tensor by tensor: bytes that need no change
// are copied straight from the input file (copy_file_range where the kernel can), a DCP
// tensor split in rows piece by piece; a strided view or another tensor assembled from
// DCP pieces is gathered in a buffer of its own size, freed before the next. Values are never converted, except by an explicit --dtype
// cast: every other output byte is an input byte.
//
// plan_convert decides everything (names, which tensors, what is dropped and why) before
// any output exists; the writers then only move bytes. What the target cannot hold is
// refused or, when the request says so, dropped and listed: never silently.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/output_dir.h"
#include "ckpt/output_set.h"
#include "ckpt/rekey.h"
#include "ckpt/slice.h"

namespace ckpt {

enum class convert_target { torch, safetensors, hf, dcp };
/// "torch", "safetensors", "hf", "dcp"; nullopt for another name.
std::optional<convert_target> convert_target_named(const std::string& name);

struct convert_request {
  convert_target to = convert_target::safetensors;
  /// Key edits, applied in order to every selected key (rekey's operations).
  std::vector<key_op> ops;
  /// fnmatch globs over the input's keys (before the edits); empty selects every key. A
  /// glob that selects nothing is refused (errc::usage): it is most likely a typo.
  std::vector<std::string> select;
  /// The state dict to convert, as a path of string keys from the root ("state_dict"):
  /// its tensor values become the keys. nullopt: the one open_checkpoint found.
  std::optional<value_path> state_dict;
  /// Drop what the target cannot hold (entries that are not tensors of the state dict,
  /// unsafe globals) and list it; without it such a checkpoint is refused (errc::unsupported
  /// or errc::unsafe) naming what would be lost.
  bool drop_other = false;
  /// --dtype: floating tensors of another floating dtype are cast to it (integers and bool
  /// are left as they are) through `cast`, which must round as torch's Tensor.to does
  /// (cast_values, or the torch plugin's). nullopt: no cast, every byte copied.
  std::optional<dtype> cast_to;
  std::function<void(const void* src, dtype from, void* dst, dtype to, uint64_t count)> cast;
  /// hf only: the Hub's max_shard_size in bytes.
  uint64_t max_shard_size = 5'000'000'000ULL;
  /// dcp only: the ranks the output is laid out for (by default each tensor split in row
  /// bands as DTensor's Shard(0) splits it over that many ranks; formats.md §9.9).
  uint32_t ranks = 1;
  /// dcp only: each key's DTensor placement over those ranks, the first matching rule's
  /// (Shard(d), Replicate(); Range is refused with errc::usage); a key no rule matches
  /// keeps the default above. Its rank and world are not used. nullopt: the default for all.
  std::optional<slice_selection> placements;
  /// Bytes of tensor data written so far and the total. Called often; keep it cheap.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

/// One tensor of the output, in state-dict order.
struct convert_tensor {
  std::string name;        // the output key (after the edits)
  std::string source_key;  // the input key
  /// Where its bytes are: one tensor record (a view of a storage), or a key of
  /// checkpoint::keys assembled from pieces (a DCP tensor); exactly one is set.
  std::optional<size_t> record;
  std::optional<size_t> assembled;
  dtype type = dtype::float32;  // as written
  dtype source_type = dtype::float32;  // as stored in the input (differs when cast)
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;     // contiguous bytes written
  uint64_t source_nbytes = 0;  // contiguous bytes read
  /// Another tensor of the plan holding the same values from the same bytes: a tie. torch
  /// writes it as the same object (tie_of: the earliest key of the tie); safetensors
  /// cannot, so it is written once, under the tie's name that sorts first (tie_of: that
  /// key, earlier or later), as huggingface_hub's save_torch_state_dict keeps it, and
  /// listed in convert_plan::ties. DCP saves each key as an item of its own, as dcp.save
  /// does for a tied parameter: never set.
  std::optional<size_t> tie_of;
};

/// --to dcp from a DCP directory: one of its BYTE_IO items (a torch.save blob of a Python
/// value), copied byte for byte under its own name and path (formats.md §9.9).
struct convert_byte_item {
  std::string name;     // its fqn
  value_path path;      // its planner_data path
  size_t file = 0;      // the checkpoint::files entry (a .distcp) holding it
  uint64_t offset = 0;  // its bytes in that file
  uint64_t length = 0;
  std::vector<std::string> transforms;  // _StorageInfo.transform_descriptors, kept as they were
};

struct convert_plan {
  convert_target to = convert_target::safetensors;
  std::vector<convert_tensor> tensors;
  rekey_plan keys;                 // input key -> output key, for the selected keys
  /// safetensors and hf: {alias, kept name} for each tie written once.
  std::vector<std::pair<std::string, std::string>> ties;
  /// dcp only: the input's BYTE_IO items carried as they are.
  std::vector<convert_byte_item> byte_items;
  /// With drop_other: what the output does not hold (entry paths, "unsafe global X").
  std::vector<std::string> dropped;
  /// What the Hub calls `metadata`: the input's own safetensors `__metadata__` (a
  /// safetensors file, or the first shard of a set), then {alias: kept name} for each tie,
  /// as safetensors' save_model and huggingface_hub record a tensor they drop. The writers
  /// add "format": "pt" where the Hub does (formats.md §13.2).
  std::vector<std::pair<std::string, std::string>> metadata;
  /// The input is safetensors: its metadata is carried as it was, "format" included.
  bool from_safetensors = false;
  uint64_t data_bytes = 0;         // the tensor bytes to write (ties once)
};

/// Plans the conversion of `c` (opened with open_checkpoint, chunk archives read). Throws
/// ckpt::error naming c's file: unsupported for a tensor the target cannot hold exactly
/// (sparse, nested, quantized, meta, a DTensor's local shard, a dtype safetensors lacks,
/// a big-endian file), for TorchScript, and for other entries without drop_other; unsafe
/// for unsafe globals without drop_other; check_failed when two keys get one name; usage
/// for a --select glob matching nothing or a --state-dict path that holds no tensor.
convert_plan plan_convert(const checkpoint& c, const convert_request& request);

/// The state dict that `text` (--state-dict: string keys from the root joined by '/',
/// "state_dict", "model/sd") names in `c`: the dict holding tensors whose path, so joined,
/// is `text`. A key may hold '/' itself ({"a/b": {...}} and {"a": {"b": {...}}} both read
/// "a/b"): when two such dicts exist the name is ambiguous, an errc::usage error naming
/// both. When none does, `text` split at every '/' (plan_convert then says it holds no
/// tensor).
value_path state_dict_path_named(const checkpoint& c, const std::string& text);

/// Casts `count` elements of `from` at `src` to `to` at `dst` exactly as torch's Tensor.to
/// does. Defined in libckpt_torch (src/torch/cast_values.cpp); the CLI reaches it through
/// the torch plugin. Throws errc::unsupported for a dtype LibTorch lacks.
void cast_values(const void* src, dtype from, void* dst, dtype to, uint64_t count);

struct convert_result {
  std::vector<std::string> files;  // written, by name (a set: its files, index last)
  uint64_t bytes_written = 0;
};

/// Writes one file (torch or safetensors) into `out` (of an open()ed output_set; the
/// caller commits). Throws errc::io (a failed write: nothing is committed) and errc::corrupt
/// when an input ends early or changed while being read.
convert_result write_converted_file(const checkpoint& c, const convert_plan& plan, output_file& out,
                                    const convert_request& request);

/// The files of the shard set plan_convert's plan makes for `max_shard_size` (formats.md
/// §10.5), the index last ("model.safetensors" alone for one shard).
std::vector<std::string> hf_set_files(const convert_plan& plan, uint64_t max_shard_size);

/// Writes the shard set into `out`, which the caller opened with hf_set_files' names (the
/// last is its index) and commits. Throws as write_converted_file.
convert_result write_converted_hf_set(const checkpoint& c, const convert_plan& plan, output_dir& out,
                                      const convert_request& request);

/// The files of the DCP directory the plan makes for `ranks` ranks: `__{r}_0.distcp` for
/// every rank, then `.metadata` (written last).
std::vector<std::string> dcp_files(const convert_plan& plan, uint32_t ranks);

/// Writes the DCP directory (formats.md §9.9) into `out`, which the caller opened with
/// dcp_files' names and commits: each tensor cut over request.ranks ranks as its placement
/// (request.placements, else Shard(0)) cuts it, each box kept once (on the rank DCP's
/// deduplication picks) as a torch.save item of that rank's file, gathered box by box
/// (never the whole tensor when it has several boxes; a column box as strided runs);
/// `.metadata` last, decoded and checked again before it is written. Throws as
/// write_converted_file, and errc::usage for a Range placement or a dimension a tensor lacks.
convert_result write_converted_dcp(const checkpoint& c, const convert_plan& plan, output_dir& out,
                                   const convert_request& request);

}  // namespace ckpt
