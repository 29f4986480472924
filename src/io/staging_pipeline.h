// Internal: executes a read plan through a ring of staging buffers: reader threads read
// file bytes into a free buffer and hand its pieces to a copy engine (copy_engine.h),
// which moves them to their destinations asynchronously. This is the logic of the CUDA
// loader without a line of CUDA, so that CI runs it on CPU against a hostile engine.
//
// The rules it keeps:
//  - A buffer is overwritten only after the copies out of it are complete (the engine's
//    ticket for it has been waited for). Completion may come in any order: a thread takes
//    a buffer never used, else one whose copies poll as done, else waits for the oldest.
//  - Every ticket is waited for exactly once, on success, failure and cancellation alike,
//    before the function returns: no copy is still reading the staging memory or writing
//    a destination when the caller frees them.
//  - The first failure (a read, a copy) stops the reads not yet started and is rethrown,
//    naming the file and the byte range whose copy failed. Nothing is reported as loaded.
//  - Progress counts storage bytes whose copies are complete.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "ckpt/byte_source.h"
#include "io/copy_engine.h"
#include "model/assembly.h"
#include "model/read_plan.h"

namespace ckpt::detail {

struct staging_ring {
  uint8_t* memory = nullptr;  // slots * slot_bytes bytes of host memory
  size_t slots = 0;           // at least 1
  uint64_t slot_bytes = 0;    // no read of the plan may be longer
};

struct staging_options {
  int threads = 1;  // reader threads (at most one per slot is useful)
  /// Called with (bytes landed, bytes total), from any of the threads.
  std::function<void(uint64_t, uint64_t)> progress;
  /// Set from another thread to stop: reads not yet started are skipped, copies in flight
  /// are waited for, and the call throws errc::io "interrupted".
  const std::atomic<bool>* cancel = nullptr;
  /// By storage (or null: none): the pieces of assembled tensors. Such a storage's
  /// destination is its tensor's first byte, and its bytes land in the box's runs there
  /// (assembly.h), each as one copy of one or more rows.
  const std::vector<const box_landing*>* boxes = nullptr;
};

/// When a staging buffer may be reused. Only after_copy is correct; too_early exists so a
/// test can show that the hostile engine catches a pipeline that does not wait.
enum class slot_reuse { after_copy, too_early };

/// Lands every piece of `plan`: file bytes [op.offset, +nbytes) of files[op.file] go to
/// destinations[piece.storage] + piece.storage_offset, or, for a storage with a box, to
/// its runs from destinations[piece.storage]. Throws ckpt::error.
template <slot_reuse reuse = slot_reuse::after_copy>
void run_staging_pipeline(const read_plan& plan, const std::vector<const byte_source*>& files,
                          const std::vector<uint8_t*>& destinations, const staging_ring& ring, copy_engine& engine,
                          const staging_options& options);

}  // namespace ckpt::detail
