// A Hugging Face shard set (an index and the shards it names, formats.md §10) opened as
// one checkpoint: each shard read by the single-file readers, the index cross-checked
// against what they hold, then merged in the order the loaders read them.
#pragma once

#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/file_opener.h"

namespace ckpt::detail {

/// Opens the set whose index is `index` (relative to `fs`'s root; its shards' names are
/// relative to the index's directory). Throws ckpt::error: corrupt, naming the index, for
/// a cross-check error (formats.md §10.3) or an index that does not parse; unsupported,
/// naming the shard, for a shard no loader of shard sets reads as ckptool would
/// (TorchScript, legacy, a format its name contradicts, not a flat {key: tensor} dict) and
/// for a mix of formats or byte orders; whatever the shard's own reader throws.
checkpoint open_hf_set(const file_opener& fs, const std::string& index, const open_options& options);

/// The index and the shards it names that exist, as fs.display names them.
std::vector<std::string> hf_set_files(const file_opener& fs, const std::string& index);

}  // namespace ckpt::detail
