// The CUDA path of load_storages: the read plan (read_plan.h) executed by the staging
// pipeline (staging_pipeline.h): file -> a small ring of pinned host buffers (pread
// straight into them) -> asynchronous host-to-device copies (cuda_copy_engine.cpp), a
// buffer refilled only once its copies are done. The checkpoint is never pinned as a
// whole, and host memory stays bounded by the ring. The plan coalesces neighbouring
// records into one read (torch.save leaves only a local header between them), so small
// tensors do not cost a system call each.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>

#include "torch/loader/storage_loader.h"
#include "torch/cuda/cuda_copy_engine.h"
#include "model/read_plan.h"
#include "io/staging_pipeline.h"

namespace ckpt::detail {

std::vector<at::Tensor> load_storages_cuda(const checkpoint& c, const std::vector<bool>& needed,
                                           const load_options& o, const piece_targets* pieces) {
  c10::cuda::CUDAGuard guard(o.device);
  const c10::DeviceIndex index = c10::cuda::current_device();
  const auto device_opts = at::TensorOptions().dtype(at::kByte).device(c10::Device(c10::kCUDA, index));

  read_plan_options po;
  po.max_gap = 4096;  // a zip local header with its padding is under 200 bytes
  po.max_read = std::max<uint64_t>(o.chunk_bytes, 1 << 20);
  // The pieces of assembled tensors join the one plan: the staging buffer is their bounce
  // buffer, copied from into the box's strided view of the tensor the caller allocated.
  std::vector<bool> wanted = needed;
  if (pieces)
    for (size_t i = 0; i < c.storages.size(); ++i) wanted[i] = wanted[i] || pieces->base[i];
  const read_plan plan = plan_reads(c, wanted, po);

  std::vector<at::Tensor> dst(c.storages.size());
  std::vector<uint8_t*> destinations(c.storages.size(), nullptr);
  for (size_t i : plan.storages) {
    if (pieces && pieces->base[i]) {
      destinations[i] = pieces->base[i];
      continue;
    }
    dst[i] = at::empty({int64_t(c.storages[i].nbytes)}, device_opts);
    destinations[i] = static_cast<uint8_t*>(dst[i].data_ptr());
  }
  if (plan.reads.empty()) return dst;

  // Buffers no longer than the longest read: a small checkpoint pins little.
  uint64_t longest = 0;
  for (const read_op& op : plan.reads) longest = std::max(longest, op.nbytes);
  const size_t slots = size_t(std::max(2, o.ring_slots));
  at::Tensor ring = at::empty({int64_t(slots * longest)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));

  // Declared after the ring, so destroyed before it: no copy outlives its staging memory.
  cuda_copy_engine engine(index);
  staging_options so;
  so.threads = std::clamp(o.threads > 0 ? o.threads : 4, 1, int(slots));
  so.progress = o.progress;
  if (pieces) so.boxes = &pieces->boxes;
  run_staging_pipeline(plan, file_sources(c), destinations, staging_ring{ring.data_ptr<uint8_t>(), slots, longest},
                       engine, so);
  return dst;
}

// For libckptool_torch_cuda.so's entry point (plugin/cuda_plugin_entry.cpp), which names
// no LibTorch type; cuda_module.cpp casts it back to cuda_loader_fn.
void* cuda_loader_address() {
  cuda_loader_fn loader = &load_storages_cuda;
  return reinterpret_cast<void*>(loader);
}

namespace {
// Installs this loader in a program that links ckpt_torch_cuda whole (ckpt_torch_with_cuda).
[[maybe_unused]] const bool kInstalled = (set_cuda_loader(&load_storages_cuda), true);
}  // namespace

}  // namespace ckpt::detail
