// Finding the CUDA loader (storage_loader.h): installed by a registrar when the program
// links ckpt_torch_cuda whole, else opened from libckptool_torch_cuda.so next to the
// module that holds this code (the CLI's libckptool_torch.so).
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "ckpt/error.h"
#include "storage_loader.h"

namespace ckpt::detail {
namespace {

std::atomic<cuda_loader_fn> g_loader{nullptr};

std::string directory_of_this_module() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&directory_of_this_module), &info) == 0 || !info.dli_fname) return ".";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Why the module could not be loaded, for the error; empty once it was.
std::string open_module() {
  std::string path;
  if (const char* env = std::getenv("CKPTOOL_TORCH_CUDA_PLUGIN"); env && *env)
    path = env;
  else
    path = directory_of_this_module() + "/libckptool_torch_cuda.so";
  // RTLD_LOCAL: its copy of ckptool's code stays its own; only the entry point is shared.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    return why ? why : path + ": cannot be loaded";
  }
  using entry_fn = void* (*)();
  auto entry = reinterpret_cast<entry_fn>(::dlsym(handle, "ckptool_cuda_loader_v1"));
  if (!entry) return path + ": no entry point ckptool_cuda_loader_v1 (a mismatched build?)";
  set_cuda_loader(reinterpret_cast<cuda_loader_fn>(entry()));
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
  std::call_once(once, [] { problem = open_module(); });
  if (cuda_loader_fn f = g_loader.load()) return f;
  throw error(errc::device, "CUDA support could not be loaded: " + problem);
#endif
}

}  // namespace ckpt::detail
