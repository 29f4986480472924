#pragma once
// Whether a view's strides are the row-major layout of its shape: its elements are then one
// run of the storage, in order, and can be copied or mapped as bytes. Dimensions of size 1
// may carry any stride, and a view without elements any strides at all (torch's own
// is_contiguous rule: torch.empty(4, 0) has strides (1, 1)).
#include "ckpt/checkpoint.h"

namespace ckpt::detail {

inline bool is_row_major(const tensor_record& t) {
  for (int64_t n : t.shape)
    if (n == 0) return true;
  int64_t expected = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.stride[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

}  // namespace ckpt::detail
