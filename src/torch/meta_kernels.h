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

}  // namespace ckpt::detail
