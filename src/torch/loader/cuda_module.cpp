// Finding the CUDA loader (storage_loader.h): installed by a registrar when the program
// links ckpt_torch_cuda whole, else opened from libckptool_torch_cuda.so next to
// libckpt_torch.so (src/plugin/module_loader.h).
#include <atomic>
#include <mutex>
#include <string>

#include "ckpt/error.h"
#include "plugin/module_loader.h"
#include "torch/loader/storage_loader.h"

namespace ckpt::detail {
namespace {

std::atomic<cuda_loader_fn> g_loader{nullptr};

// Why the module could not be loaded, for the error; empty once it was.
std::string open_cuda_module() {
  // Next to the library that holds this code (libckpt_torch.so), where the build and the
  // install both put it.
  std::string dir = directory_of_code_at(reinterpret_cast<const void*>(&open_cuda_module));
  module_entry found = open_module("CKPTOOL_TORCH_CUDA_PLUGIN", {dir + "/libckptool_torch_cuda.so"},
                                   "ckptool_cuda_loader_v2");
  if (!found.entry) return found.problem.empty() ? dir + "/libckptool_torch_cuda.so: not found" : found.problem;
  using entry_fn = void* (*)();
  set_cuda_loader(reinterpret_cast<cuda_loader_fn>(reinterpret_cast<entry_fn>(found.entry)()));
  return {};
}

}  // namespace

void set_cuda_loader(cuda_loader_fn loader) { g_loader.store(loader); }

cuda_loader_fn cuda_loader() {
  if (cuda_loader_fn f = g_loader.load()) return f;
#ifndef CKPTOOL_WITH_CUDA
  throw error(errc::device, "this ckptool was built without CUDA (LibTorch without CUDA, or no CUDA toolkit at build time)");
#else
  static std::once_flag once;
  static std::string problem;
  std::call_once(once, [] { problem = open_cuda_module(); });
  if (cuda_loader_fn f = g_loader.load()) return f;
  throw error(errc::device, "CUDA support could not be loaded: " + problem);
#endif
}

}  // namespace ckpt::detail
