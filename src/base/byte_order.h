// Internal: the byte swap torch.load applies to a storage saved on a big-endian host
// (record `byteorder` says "big"; docs/formats.md §2.2), for the readers that hand out
// values: materialize's loader and diff.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ckpt/dtype.h"

namespace ckpt::detail {

/// The bytes reversed together: an element, but each half of a complex number on its own
/// (torch/storage.py `byteswap`: "for complex types, don't swap first and second numbers").
inline uint32_t byteswap_width(dtype t) {
  const uint32_t w = element_size(t);
  return t == dtype::complex32 || t == dtype::complex64 || t == dtype::complex128 ? w / 2 : w;
}

/// Reverses each `width`-byte group of the first nbytes bytes at p (a partial group at the
/// end is left as it is: no storage of whole elements has one).
inline void byteswap_in_place(uint8_t* p, uint64_t nbytes, uint32_t width) {
  if (width <= 1) return;
  for (uint64_t i = 0; i + width <= nbytes; i += width) std::reverse(p + i, p + i + width);
}

}  // namespace ckpt::detail
