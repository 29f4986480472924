// Internal: the AOTInductor package reader's helpers shared by its files (ckpt/aoti.h is
// the interface; formats.md §15).
#pragma once

#include <cstdint>
#include <optional>

#include "ckpt/aoti.h"

namespace ckpt::aoti {

/// Bytes of its storage a constant's view reaches (offset plus the farthest element, times
/// the element size); nullopt for an unknown dtype or an opaque layout.
std::optional<uint64_t> constant_extent(const constant& c);

}  // namespace ckpt::aoti
