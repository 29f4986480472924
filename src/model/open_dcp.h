// The reader of torch.distributed.checkpoint directories (docs/formats.md §9): `.metadata`
// decoded under the DCP vocabulary, every chunk a tensor record, every tensor a key of one
// piece or of several.
#pragma once

#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/file_opener.h"

namespace ckpt::detail {

/// Opens the DCP checkpoint in directory `dir` (relative to `fs`'s root; "" is the root).
/// Throws ckpt::error naming the file (`.metadata` or a `.distcp`) and byte offset.
checkpoint open_dcp(const file_opener& fs, const std::string& dir, const open_options& options);

}  // namespace ckpt::detail
