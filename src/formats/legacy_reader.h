// Internal: the pre-1.6 torch.save stream (_use_new_zipfile_serialization=False), a
// sequence of pickles followed by raw storages (formats.md §4.1, security.md P6):
//   magic (LONG1, or LONG text below protocol 2) | protocol 1001 | sys_info | object | storage keys | storages
// where each storage is an int64 LE element count followed by count x element-size bytes.
#pragma once

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

/// Fills c.files[file].pickle, c.storages and c.tensors from the legacy stream in c.files[file].
void read_legacy(checkpoint& c, uint32_t file, const open_options& options);

}  // namespace ckpt::detail
