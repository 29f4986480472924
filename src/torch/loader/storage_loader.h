// Internal: reads the storages of a checkpoint into byte tensors on a device, one
// allocation per storage, each byte read from the file once.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/load.h"
#include "model/assembly.h"

namespace ckpt::detail {

/// Storages whose bytes land in tensors the caller allocated, not in byte tensors of their
/// own: the pieces of assembled keys (assembly.h). Indexed like c.storages; empty: none.
struct piece_targets {
  std::vector<uint8_t*> base;             // the tensor's first byte; null: not a piece
  std::vector<const box_landing*> boxes;  // where in it each piece's bytes go
  // The tensor's bytes when it has a CPU mapping of its own whose pages nothing has touched
  // (allocate_host_tensor), else 0 or empty: only such pages may be claimed by the page
  // filler (piece_reader.cpp), which needs them fresh and the tensor's alone.
  std::vector<uint64_t> fresh_bytes;
  bool empty() const { return base.empty(); }
};

/// Byte (uint8) tensors indexed like c.storages; undefined where !needed[i]. Meta device:
/// meta byte tensors, nothing read. With `pieces`, also lands the bytes of each piece
/// storage (never needed[i] too) in its tensor, every byte read once; not with --mmap.
std::vector<at::Tensor> load_storages(const checkpoint& c, const std::vector<bool>& needed,
                                      const load_options& options, const piece_targets* pieces = nullptr);

/// The tensor view `t` over its loaded storage bytes (or an empty meta tensor for a
/// checkpoint meta tensor).
at::Tensor view_of(const tensor_record& t, const std::vector<at::Tensor>& storages, const c10::Device& device);

/// Sets `r`'s conjugate and negative bits on `t`, a tensor holding `r`'s stored elements, as
/// torch.load's set_tensor_metadata does: the bits are the view's, the bytes stay as stored.
void set_tensor_bits(at::Tensor& t, const tensor_record& r);

/// A sparse tensor built from its components' views (the same LibTorch kind torch.load
/// gives); throws errc::unsupported for a kind LibTorch cannot build (nested tensors).
at::Tensor composite_tensor(const tensor_record& t, const std::vector<at::Tensor>& storages, const c10::Device& device);

/// Threads that read or map storages: options.threads, else the machine's cores (1-8).
int loader_threads(const load_options& options);

/// Calls piece(0) ... piece(count - 1), each once, from up to `threads` threads (the caller's
/// among them; fewer when no more threads can be created). The first exception stops the
/// pieces not yet started and is rethrown once all threads are done.
void for_each_piece(size_t count, int threads, const std::function<void(size_t)>& piece);

/// The CPU path (cpu_loader.cpp).
std::vector<at::Tensor> load_storages_cpu(const checkpoint& c, const std::vector<bool>& needed,
                                          const load_options& options);
/// The CPU path for pieces (piece_reader.cpp): `progress_base` bytes are already done.
void land_pieces_cpu(const checkpoint& c, const piece_targets& pieces, const load_options& options,
                     uint64_t progress_base, uint64_t progress_total);

/// CUDA build only (cuda/cuda_loader.cpp): the pinned-ring loader, pieces included.
std::vector<at::Tensor> load_storages_cuda(const checkpoint& c, const std::vector<bool>& needed,
                                           const load_options& options, const piece_targets* pieces);

/// The CUDA loader lives apart from the rest (ckpt_torch_cuda), so that CPU work never
/// loads LibTorch's CUDA libraries. A program that links it whole gets it installed by a
/// registrar; otherwise the first CUDA device named opens libckptool_torch_cuda.so from
/// the directory of the module holding this code (cuda_module.cpp).
using cuda_loader_fn = std::vector<at::Tensor> (*)(const checkpoint&, const std::vector<bool>&,
                                                   const load_options&, const piece_targets*);
void set_cuda_loader(cuda_loader_fn loader);
/// The installed loader, opening the module if needed. Throws errc::device when this build
/// has no CUDA or the module cannot be loaded.
cuda_loader_fn cuda_loader();

/// Throws errc::device when `device` cannot be used by this build on this machine.
void check_device(const c10::Device& device);

}  // namespace ckpt::detail
