// Internal: the copy engine (copy_engine.h) of the CUDA loader, the only code of it that
// calls CUDA. Everything else about staging (which buffer, when it may be reused, errors,
// progress) is the staging pipeline's, tested on CPU against a hostile engine.
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "io/copy_engine.h"

namespace ckpt::detail {

class cuda_copy_engine final : public copy_engine {
 public:
  /// Copies go to memory of `device`, on a stream of its own, ordered after the work
  /// already queued on the device's current stream.
  explicit cuda_copy_engine(c10::DeviceIndex device);
  ~cuda_copy_engine() override;
  cuda_copy_engine(const cuda_copy_engine&) = delete;
  cuda_copy_engine& operator=(const cuda_copy_engine&) = delete;

  ticket submit(const copy_request* copies, size_t count) override;
  bool poll(ticket t) override;
  void wait(ticket t) override;

 private:
  cudaEvent_t event_of(ticket t);

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
  std::mutex mutex_;
  std::unordered_map<ticket, cudaEvent_t> pending_;
  std::vector<cudaEvent_t> spare_;  // waited for, ready to be recorded again
  ticket next_ = 0;
};

}  // namespace ckpt::detail
