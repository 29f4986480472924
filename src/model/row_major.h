#pragma once
// Whether a view's strides are the row-major layout of its shape: its elements are then one
// run of the storage, in order, and can be copied or mapped as bytes. Dimensions of size 1
// may carry any stride (torch's own is_contiguous rule).
#include "ckpt/checkpoint.h"

namespace ckpt::detail {

inline bool is_row_major(const tensor_record& t) {
  int64_t expected = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.stride[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

}  // namespace ckpt::detail
