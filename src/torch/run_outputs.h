#pragma once
// What `--run` reports of a method's result, whichever runtime ran it (TorchScript's
// interpreter or the ExportedProgram runner): one row per leaf, tensors with dtype, shape
// and a checksum, other values as their (shortened) text.

#include <string>

#include <ATen/core/ivalue.h>

#include "ckpt/materialize.h"

namespace ckpt::detail {

// Appends one output row and one checksum per leaf of `v` to `r`; tuples, lists and dicts
// are walked, their leaves named `path.0`, `path.key`. A meta tensor has no values: its
// checksum is NaN (null in JSON).
void record_outputs(const c10::IValue& v, const std::string& path, materialize_report& r);

}  // namespace ckpt::detail
