// Internal: torch.export archives (formats.md §14) as checkpoints. Detected by content (the
// `archive_format` record), read from the zip directory and the JSON records alone: every
// weight_<i> / tensor_<i> file is a storage, every payload-config entry a view of it, as
// torch.export.load builds them; the programs are parsed for inspect and verify.
#pragma once

#include <cstdint>

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

/// True when the archive's `archive_format` record says exactly `pt2`: what makes it a
/// torch.export or AOTInductor archive rather than a torch.save one.
bool has_pt2_format_record(const zip::archive& ar);

/// Reads c.files[file] (whose zip is open) as a torch.export archive: fills c's storages,
/// tensors, keys and c.pt2. Throws ckpt::error: unsupported (another archive_format or
/// archive_version, big-endian data, compressed or pickled payloads materialize would need,
/// an AOTInductor package without a program), corrupt (configs that disagree with the
/// files), limit.
void read_pt2(checkpoint& c, uint32_t file, const open_options& opt);

}  // namespace ckpt::detail
