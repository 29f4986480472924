// `ckptool rekey` on a checkpoint of several files, written as a set into an output
// directory (ckpt/output_dir.h). One function per layout fills the staging directory; the
// output_dir's commit puts the set in place.
//   - Hugging Face shard sets (formats.md §10, §11.2): rekey_hf_set.
//   - torch.distributed.checkpoint: write_rekeyed_dcp (ckpt/dcp_rekey.h) fills the
//     staging directory with the copied data files and the new `.metadata`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/output_dir.h"
#include "ckpt/rekey.h"
#include "ckpt/rekey_file.h"

namespace ckpt {

struct rekey_set_request {
  std::vector<key_op> ops;
  unsafe_policy unsafe = unsafe_policy::refuse;
  bool dry_run = false;
  /// The limits every file of the set is opened (and read back) with.
  open_options reader;
  /// Bytes written so far over the whole set, and the expected total.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct rekey_set_result {
  std::string index;                          // the index's file name (also the new one's)
  std::vector<std::string> files;             // the new set's files, index last
  rekey_plan plan;                            // every key of every shard, shard by shard
  std::vector<std::string> mirrored_dicts;    // "SHARD: path" of dicts renamed with the keys
  size_t metadata_renamed = 0;
  std::vector<std::string> dropped;           // "SHARD: path" removed by --drop-unsafe
  std::vector<std::string> notes;             // what the index check warned about
  /// Regular files beside the index that are not of the set (config.json, tokenizer
  /// files, ...): not written (formats.md §11.2), named so that the user can copy them.
  std::vector<std::string> left_behind;
  uint64_t bytes_written = 0;
};

/// Plans the renaming over every key of every shard of the set whose index is
/// `index_path` (collisions across shards are errc::check_failed naming the keys, before
/// anything is written) and, unless dry_run, writes each shard under its own name with
/// rekey_file and the index with weight_map renamed (its order and `metadata` kept, written
/// the way its writer writes it) into `out`, which this declares its inputs to and opens;
/// the caller commits. Throws errc::corrupt for a set whose index and shards disagree
/// (formats.md §10.3 errors), errc::unsupported for a shard name with a directory in it.
rekey_set_result rekey_hf_set(const std::string& index_path, output_dir* out, const rekey_set_request& request);

/// Every shard's tensors as --match sees them (key, dtype, shape), shard by shard in the
/// loaders' order, for aligning a whole set to a model or checkpoint.
std::vector<keyed_tensor> hf_set_keyed_tensors(const std::string& index_path, const open_options& reader);

/// The index text written for a renamed weight_map: `text` is the input index; keys are
/// renamed through `rename` (old -> new). The output is what the input's writer writes:
/// transformers' json.dumps(indent=2, sort_keys=True) + "\n" when the input ends with a
/// newline and its keys were sorted at every level, else huggingface_hub's
/// json.dump(indent=2) in the input's order (a final newline kept if the input had one).
/// Non-ASCII is escaped as Python's json does by default.
std::string renamed_index_text(const std::string& text,
                               const std::function<std::string(const std::string&)>& rename);

}  // namespace ckpt
