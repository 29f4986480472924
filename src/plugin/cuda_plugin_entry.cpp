// The entry point of libckptool_torch_cuda.so: the CUDA loader, handed to
// libckptool_torch.so, which opens this module the first time a CUDA device is named
// (src/torch/loader/cuda_module.cpp). Loading it loads LibTorch's CUDA libraries, which register
// the CUDA backend with the LibTorch already in the process.
#include "torch/loader/storage_loader.h"
#include "plugin/module_loader.h"

CKPTOOL_MODULE_EXPORT_BUILD_ID

extern "C" __attribute__((visibility("default"))) void* ckptool_cuda_loader_v2() {
  return reinterpret_cast<void*>(&ckpt::detail::load_storages_cuda);
}
