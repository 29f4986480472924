// cast_values (ckpt/convert.h): convert --dtype's cast, done by LibTorch itself so that
// every value rounds exactly as Tensor.to rounds it (formats.md §13.5).
#include <ATen/ATen.h>

#include <cstring>

#include "ckpt/convert.h"
#include "torch/aten_types.h"

namespace ckpt {

void cast_values(const void* src, dtype from, void* dst, dtype to, uint64_t count) {
  if (count == 0) return;
  const at::Tensor in = at::from_blob(const_cast<void*>(src), {int64_t(count)},
                                      at::TensorOptions().dtype(detail::scalar_type(from)));
  at::Tensor out = at::from_blob(dst, {int64_t(count)}, at::TensorOptions().dtype(detail::scalar_type(to)));
  out.copy_(in);  // Tensor.to's conversion, written into the caller's buffer
}

}  // namespace ckpt
