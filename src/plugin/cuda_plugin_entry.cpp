// The entry point of libckptool_torch_cuda.so: the CUDA loader, handed to
// libckptool_torch.so, which opens this module the first time a CUDA device is named
// (src/torch/loader/cuda_module.cpp). Loading it loads LibTorch's CUDA libraries, which register
// the CUDA backend with the LibTorch already in the process.
// No LibTorch header here: the loader's address comes from cuda_loader.cpp, and this file
// compiles in a fraction of a second instead of ~30 s spent parsing ATen for one pointer.
#include "plugin/module_loader.h"

namespace ckpt::detail {
void* cuda_loader_address();  // cuda/cuda_loader.cpp: load_storages_cuda as a cuda_loader_fn
}

CKPTOOL_MODULE_EXPORT_BUILD_ID

extern "C" __attribute__((visibility("default"))) void* ckptool_cuda_loader_v2() {
  return ckpt::detail::cuda_loader_address();
}
