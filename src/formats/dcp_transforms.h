// The stream transforms a DCP writer may wrap an item in (docs/formats.md §9.3): undone in
// memory, bounded, before the item's archive is read. Only what PyTorch ships is known
// (`stream.zstd/1`); anything else is refused, as FileSystemReader refuses it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"

namespace ckpt::detail {

/// The bytes of `src` with `descriptors` undone in order (FileSystemReader's order). Throws
/// errc::unsupported for an unknown descriptor, errc::corrupt for a broken stream (the
/// offset is in `src`, which names its file), errc::limit when the result would pass
/// `max_bytes`.
std::vector<uint8_t> undo_dcp_transforms(const byte_source& src, const std::vector<std::string>& descriptors,
                                         uint64_t max_bytes);

/// True when every descriptor is one undo_dcp_transforms knows.
bool known_dcp_transforms(const std::vector<std::string>& descriptors);

}  // namespace ckpt::detail
