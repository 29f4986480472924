// --check-finite: which floating tensors hold NaN or Inf.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace ckpt::detail {

/// The names of the floating-point tensors with a NaN or an infinity among their own
/// elements, in input order. Work and memory follow the storages, not the logical views:
/// each storage is scanned once per dtype, in bounded chunks; only a storage that holds a
/// non-finite value is looked at again, per view, and then only at the view's elements
/// (a broadcast view of 10^12 elements over one float costs one float). Meta tensors have
/// no values: the caller refuses them.
std::vector<std::string> non_finite(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

}  // namespace ckpt::detail
