// Internal: ckpt::dtype <-> c10::ScalarType.
#pragma once

#include <c10/core/ScalarType.h>

#include "ckpt/dtype.h"

namespace ckpt::detail {

/// Throws errc::unsupported for dtypes this LibTorch cannot hold.
c10::ScalarType scalar_type(dtype t);
dtype from_scalar_type(c10::ScalarType t);

}  // namespace ckpt::detail
