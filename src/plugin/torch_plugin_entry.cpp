// The entry point of libckptool_torch.so (see src/plugin/torch_plugin.h).
#include <torch/version.h>

#include "plugin/torch_plugin.h"
#include "plugin/module_loader.h"
#include "torch/c10d_group.h"

CKPTOOL_MODULE_EXPORT_BUILD_ID

extern "C" __attribute__((visibility("default"))) const ckpt::torch_plugin_api* ckptool_torch_plugin() {
  static const ckpt::torch_plugin_api api = [] {
    ckpt::torch_plugin_api a;
    a.torch_version = TORCH_VERSION;
#ifdef CKPTOOL_WITH_CUDA
    a.has_cuda = true;
#else
    a.has_cuda = false;
#endif
    a.inspect_torchscript = &ckpt::inspect_torchscript;
    a.run_on_meta = &ckpt::run_on_meta;
    a.materialize = &ckpt::materialize;
    a.cast_values = &ckpt::cast_values;
    a.open_process_group = &ckpt::open_c10d_group;
    return a;
  }();
  return &api;
}
