// The reader of torch.distributed.checkpoint directories (docs/formats.md §9): `.metadata`
// decoded under the DCP vocabulary, every chunk a tensor record, every tensor a key of one
// piece or of several.
#pragma once

#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/file_opener.h"
#include "model/layout.h"

namespace ckpt::detail {

/// Opens the DCP checkpoint detect_layout found (`l.file` the directory, relative to `fs`'s
/// root; "" is the root): its `.metadata`, or the rank-local `__N.metadata` files merged
/// (docs/formats.md §9.8). Throws ckpt::error naming the file (a metadata file or a
/// `.distcp`) and byte offset.
checkpoint open_dcp(const file_opener& fs, const layout& l, const open_options& options);

}  // namespace ckpt::detail
