// Internal: the names load_tensors gives a checkpoint's tensors (load.cpp), shared with the
// sliced load (load_slices.cpp) so both return the same keys in the same order.
#pragma once

#include <string>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

// A tensor to return: a record of c.tensors, or a key assembled from pieces.
struct named_tensor {
  std::string name;
  size_t tensor = 0;  // index into c.tensors, unless `assembled`
  bool assembled = false;
  size_t key = 0;  // index into c.keys when `assembled`
  bool by_path = false;  // named by its path in the pickle: no state dict holds it under `name`
};

std::vector<named_tensor> named_tensors(const checkpoint& c);

}  // namespace ckpt::detail
