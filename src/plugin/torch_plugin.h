// LibTorch is loaded only when a command needs it. The `ckptool` executable links only
// ckpt_core; TorchScript and device work live in a plugin, libckptool_torch.so, opened with
// dlopen on first use. Loading LibTorch with its CUDA libraries costs over half a second
// per process, which metadata-only commands like `inspect` must not pay.
//
// Embedders that link ckpt_torch directly call the functions in ckpt/torchscript.h and
// never need this.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/convert.h"
#include "ckpt/distributed.h"
#include "ckpt/materialize.h"
#include "ckpt/torchscript.h"
#include "ckpt/zip_reader.h"

namespace ckpt {

/// The plugin's functions. No version field: the loader refuses a plugin whose build id
/// (a hash of every shared header, src/plugin/module_loader.h) differs from its own.
struct torch_plugin_api {
  const char* torch_version;  // LibTorch's version string, for --version and reports
  bool has_cuda;              // built with the CUDA code paths
  torchscript_info (*inspect_torchscript)(const std::string& path, const zip::archive& ar, bool allow_code);
  std::vector<meta_output> (*run_on_meta)(const std::string& path, const zip::archive& ar,
                                          const std::string& method, const std::vector<input_spec>& inputs,
                                          bool allow_code, const std::vector<arg_spec>& args);
  materialize_report (*materialize)(checkpoint& c, const materialize_request& request);
  void (*cast_values)(const void* src, dtype from, void* dst, dtype to, uint64_t count);  // convert --dtype
  // Parallel convert and verify: the launcher's process group over c10d (src/torch/c10d_group.h).
  std::unique_ptr<process_group> (*open_process_group)(const launch_info& launch, std::chrono::milliseconds timeout);
};

/// The plugin's entry points, loading it on first call from $CKPTOOL_TORCH_PLUGIN, else
/// next to the executable, else <prefix>/lib/ckptool/. Throws errc::unsupported naming
/// what failed (missing file, missing LibTorch libraries, another build's plugin), or
/// errc::io when $CKPTOOL_TORCH_PLUGIN names a file that is not there.
const torch_plugin_api& torch_plugin();

}  // namespace ckpt

/// The symbol the plugin exports.
extern "C" const ckpt::torch_plugin_api* ckptool_torch_plugin();
