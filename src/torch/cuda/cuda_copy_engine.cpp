// The CUDA calls of the CUDA loader, each with why it is correct:
//  - c10::cuda::getStreamFromPool: a stream of the device's pool, so the copies neither
//    wait for nor hold up the caller's stream, and every copy is ordered on one stream.
//  - cudaEventRecord on the caller's current stream + cudaStreamWaitEvent(stream_): the
//    caching allocator hands the destinations out in the order of the caller's stream, so
//    memory freed by work still queued there may be among them; our copies start after it.
//  - cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_): from pinned staging
//    memory (at::empty(pinned_memory) in cuda_loader.cpp, i.e. cudaHostAlloc) this is a
//    true asynchronous DMA that reads the source at some later time: hence the pipeline's
//    rule that a buffer is not refilled before its ticket is waited for.
//  - cudaEventRecord(event, stream_) after a submission's copies: the event completes once
//    all work before it on the stream did, so once these copies are done (earlier ones too).
//  - cudaEventQuery (poll) and cudaEventSynchronize (wait): a copy that failed makes these
//    return its error (sticky errors included), which wait turns into ckpt::error(device).
// Nothing here tracks the staging memory for LibTorch's host allocator (copy_ would record
// an event on it): the pipeline waits for every ticket before the ring can be freed.
#include "torch/cuda/cuda_copy_engine.h"

#include <c10/cuda/CUDAGuard.h>

#include <string>

#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw error(errc::device, std::string(call) + " failed: " + cudaGetErrorString(status));
}

}  // namespace

cuda_copy_engine::cuda_copy_engine(c10::DeviceIndex device)
    : device_(device), stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)) {
  c10::cuda::CUDAGuard guard(device_);
  cudaEvent_t queued;
  check(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  cudaError_t status = cudaEventRecord(queued, c10::cuda::getCurrentCUDAStream(device_).stream());
  if (status == cudaSuccess) status = cudaStreamWaitEvent(stream_.stream(), queued, 0);
  cudaEventDestroy(queued);  // released once the wait is satisfied; the wait stays queued
  check(status, "ordering the copy stream after the current stream");
}

cuda_copy_engine::~cuda_copy_engine() {
  c10::cuda::CUDAGuard guard(device_);
  // The pipeline waits for every ticket; should one be left, it is finished first, so no
  // copy outlives the memory it reads.
  for (auto& [t, e] : pending_) {
    cudaEventSynchronize(e);
    cudaEventDestroy(e);
  }
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

copy_engine::ticket cuda_copy_engine::submit(const copy_request* copies, size_t count) {
  c10::cuda::CUDAGuard guard(device_);  // reader threads start with device 0 current
  cudaEvent_t done = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!spare_.empty()) {
      done = spare_.back();
      spare_.pop_back();
    }
  }
  if (!done) check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  try {
    for (size_t k = 0; k < count; ++k) {
      const copy_request& r = copies[k];
      if (r.rows <= 1)
        check(cudaMemcpyAsync(r.dst, r.src, size_t(r.nbytes), cudaMemcpyHostToDevice, stream_.stream()),
              "cudaMemcpyAsync");
      else  // rows of a piece into a strided view of its tensor
        check(cudaMemcpy2DAsync(r.dst, size_t(r.dst_pitch), r.src, size_t(r.nbytes), size_t(r.nbytes),
                                size_t(r.rows), cudaMemcpyHostToDevice, stream_.stream()),
              "cudaMemcpy2DAsync");
    }
    check(cudaEventRecord(done, stream_.stream()), "cudaEventRecord");
  } catch (...) {
    // Copies queued before the failure may still read the buffer: finish them first.
    cudaStreamSynchronize(stream_.stream());
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(done);
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const ticket t = next_++;
  pending_.emplace(t, done);
  return t;
}

cudaEvent_t cuda_copy_engine::event_of(ticket t) {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.at(t);
}

bool cuda_copy_engine::poll(ticket t) {
  c10::cuda::CUDAGuard guard(device_);
  // cudaErrorNotReady is the only "not yet"; any other answer is final (wait reports it).
  return cudaEventQuery(event_of(t)) != cudaErrorNotReady;
}

void cuda_copy_engine::wait(ticket t) {
  c10::cuda::CUDAGuard guard(device_);
  cudaEvent_t e = event_of(t);
  const cudaError_t status = cudaEventSynchronize(e);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(t);
    spare_.push_back(e);
  }
  check(status, "copying to the device (cudaEventSynchronize)");
}

}  // namespace ckpt::detail
