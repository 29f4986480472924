// Shape-only (Meta) kernels for common operators that LibTorch's C++ library lacks.
//
// Python registers many meta kernels in Python (torch/_meta_registrations.py), so
// conv2d on meta works in Python but not in a C++ program: without these, run_on_meta
// fails for any convolutional or normalised network. Each kernel is registered only when
// the running LibTorch has no Meta kernel of its own for that operator.
#pragma once

namespace ckpt::detail {

/// Registers the kernels once per process (thread-safe, idempotent).
void ensure_meta_kernels();

/// While one is alive on a thread, aten::equal on meta tensors answers by identity (the
/// same tensor is equal to itself, any two others are not) instead of failing. Loading a
/// module on meta needs it: the compiler's constant pooling compares tensor constants
/// (two uses of one CONSTANTS.cN in a graph), and a "no" only leaves two constants
/// unmerged. Everywhere else aten::equal on meta still fails for want of values.
class identity_equal_scope {
 public:
  identity_equal_scope();
  ~identity_equal_scope();
  identity_equal_scope(const identity_equal_scope&) = delete;
  identity_equal_scope& operator=(const identity_equal_scope&) = delete;
};

}  // namespace ckpt::detail
