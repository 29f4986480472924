// Internal: the few operations the staging pipeline (staging_pipeline.h) needs from the
// thing that moves bytes out of a staging buffer to their destination. On a GPU that is
// cudaMemcpyAsync on a stream with an event per submission (torch/cuda/cuda_copy_engine.cpp);
// in tests it is an engine that completes copies late, out of order, from another thread,
// and poisons the staging bytes as soon as it has taken them (tests/unit/hostile_copy_engine.h).
// The pipeline is correct only if it is correct against every engine that keeps this
// contract, which is why the contract is all it may assume.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt::detail {

struct copy_request {
  const uint8_t* src;  // staging (host) memory
  uint8_t* dst;        // destination memory; opaque to the pipeline (device memory on a GPU)
  uint64_t nbytes;     // per row
  // A piece of an assembled tensor lands in a strided view of it: `rows` rows of nbytes,
  // consecutive at src, dst_pitch bytes apart at dst (cudaMemcpy2DAsync).
  uint64_t rows = 1;
  uint64_t dst_pitch = 0;
};

class copy_engine {
 public:
  using ticket = uint64_t;
  virtual ~copy_engine() = default;

  /// Starts the copies and returns, usually before they are done. The engine may read the
  /// source bytes at any moment until the ticket is complete, so they must not change
  /// until then; afterwards it may have changed them. Safe to call from several threads.
  virtual ticket submit(const copy_request* copies, size_t count) = 0;
  /// Whether the ticket's copies are complete, without blocking. A true answer is final.
  virtual bool poll(ticket t) = 0;
  /// Blocks until the ticket's copies are complete; throws ckpt::error when one of them
  /// failed. Every ticket is waited for exactly once, after which it is forgotten. Safe
  /// to call from several threads at once (on different tickets).
  virtual void wait(ticket t) = 0;
};

}  // namespace ckpt::detail
