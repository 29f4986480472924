// Internal: materialize into an AOTInductor package (aoti_swap.cpp; formats.md §15.5).
#pragma once

#include "ckpt/materialize.h"

namespace ckpt::detail {

/// materialize() when request.aoti_model is set: request.model is the package's path.
materialize_report materialize_aoti(checkpoint& c, const materialize_request& request);

}  // namespace ckpt::detail
