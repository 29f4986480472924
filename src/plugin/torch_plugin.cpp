#include "plugin/torch_plugin.h"

#include <mutex>

#include "ckpt/error.h"
#include "plugin/module_loader.h"

namespace ckpt {
namespace {

const torch_plugin_api* load() {
  std::string dir = executable_directory();
  module_entry found = open_module("CKPTOOL_TORCH_PLUGIN",
                                   {dir + "/libckptool_torch.so", dir + "/../lib/ckptool/libckptool_torch.so"},
                                   "ckptool_torch_plugin");
  if (found.named_file_missing) throw error(errc::io, found.problem);
  if (!found.entry) {
    throw error(errc::unsupported, "this needs LibTorch, and the plugin libckptool_torch.so " +
                                       std::string(found.problem.empty() ? "was not found next to ckptool"
                                                                         : "could not be loaded: " + found.problem));
  }
  auto entry = reinterpret_cast<const torch_plugin_api* (*)()>(found.entry);
  const torch_plugin_api* api = entry();
  if (!api) throw error(errc::unsupported, found.path + " is not a ckptool LibTorch plugin");
  return api;
}

}  // namespace

const torch_plugin_api& torch_plugin() {
  static const torch_plugin_api* api = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { api = load(); });
  return *api;
}

}  // namespace ckpt
