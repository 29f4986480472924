// The reader of DCP directories written by HuggingFaceStorageWriter(save_distributed=True)
// (docs/formats.md §9.10): safetensors files, each tensor a box of its global tensor at the
// offsets DCP_SHARDING_INFO gives, keys assembled from the boxes of every file.
#pragma once

#include "ckpt/checkpoint.h"
#include "ckpt/file_opener.h"
#include "model/layout.h"

namespace ckpt::detail {

/// Opens the directory detect_layout found (`l.file`, its `*.safetensors` in `l.parts`).
/// Throws ckpt::error naming the file (and byte, for a broken header); coverage errors
/// name the key, the box and the file it came from.
checkpoint open_dcp_safetensors(const file_opener& fs, const layout& l, const open_options& options);

}  // namespace ckpt::detail
