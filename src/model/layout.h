// Which files make a checkpoint, decided from names alone before any byte is sniffed:
// a single file, a Hugging Face shard set (an index JSON and the shards it names), or a
// torch.distributed.checkpoint directory (`.metadata` and `*.distcp`). formats.md §1.1
// is the table this follows; §7 defines file set.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckpt/file_opener.h"

namespace ckpt::detail {

enum class layout_kind {
  single_file,  // `file` is the checkpoint (N = 1)
  hf_index,     // `file` is a shard index (`*.index.json`, `*.index.VARIANT.json`)
  dcp,          // `file` is the directory holding `.metadata` (or rank-local `__N.metadata`)
  // `file` is a directory of safetensors pieces written by DCP's HuggingFaceStorageWriter
  // with save_distributed=True (formats.md §9.10); `parts` its `*.safetensors` names
  dcp_safetensors,
};

struct layout {
  layout_kind kind = layout_kind::single_file;
  std::string file;                // relative to the opener's root
  std::vector<std::string> parts;  // dcp: the `*.distcp` names, sorted
  // dcp: `.metadata`, or when there is none the rank-local `__N.metadata` files of a
  // use_collectives=False save (formats.md §9.8), in rank order.
  std::vector<std::string> metadata;
};

/// True for a Hugging Face shard index's name: `model.safetensors.index.json`,
/// `pytorch_model.bin.index.json`, or with a variant, `model.safetensors.index.fp16.json`.
bool is_shard_index_name(const std::string& name);

/// Decides the layout of `path` (relative to `fs`'s root; "" is the root). A path that is
/// not a directory is a single file, or a shard index by its name; whether it exists and
/// is a regular file is left to the open that follows, which says so in today's words.
/// A directory is a DCP checkpoint if it holds `.metadata` or `__N.metadata`, a shard set if it holds one
/// index, a HuggingFaceStorageWriter directory (§9.10) if it holds no index but files named
/// `shard-NNNNN-model-NNNNN-of-NNNNN.safetensors`, and that file if it holds exactly one of `model.safetensors` and
/// `pytorch_model.bin`. Any other directory is refused as before layouts existed
/// (errc::usage, "not a regular file: a directory ..."), naming what it holds.
layout detect_layout(const file_opener& fs, const std::string& path);

/// detect_layout's file: the one file to open (a shard set's index), or a DCP directory.
std::string resolve_layout(const file_opener& fs, const std::string& path);

/// A path as (its directory, its last component): "d/x.json" -> ("d", "x.json"),
/// "x.json" -> ("", "x.json"), "/x" -> ("/", "x"). The directory is the root of the
/// opener that the names a file gives (shards) resolve against.
std::pair<std::string, std::string> parent_and_name(const std::string& path);

}  // namespace ckpt::detail
