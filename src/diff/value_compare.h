// Internal: one pair of tensors' values, compared window by window: both sides' bytes are
// read (B's on a second thread), compared with memcmp, and only elements whose bytes differ
// are decoded and judged by torch.allclose's rule (docs/formats.md §12.3).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ckpt/diff.h"
#include "diff/key_reader.h"

namespace ckpt::detail {

/// Window buffers, reused from tensor to tensor.
struct compare_buffers {
  std::vector<uint8_t> a, b;
};

/// Fills d's value fields (d.type_a / type_b and shapes already set, shapes equal) from the
/// two readers. `progress(n)` is told of each n bytes compared.
void compare_values(key_reader& a, key_reader& b, const diff_options& o, compare_buffers& buffers, tensor_diff& d,
                    const std::function<void(uint64_t)>& progress);

}  // namespace ckpt::detail
