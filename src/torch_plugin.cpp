#include "ckpt/torch_plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ckpt/error.h"

namespace ckpt {
namespace {

std::string executable_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, size_t(n));
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

const torch_plugin_api* load() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CKPTOOL_TORCH_PLUGIN"); env && *env) {
    // The user named this file: not finding it is not "the plugin was not found next to
    // ckptool", and nothing else is tried in its place.
    if (::access(env, F_OK) != 0)
      throw error(errc::io, std::string("CKPTOOL_TORCH_PLUGIN=") + env + ": " + std::strerror(errno));
    candidates.push_back(env);
  } else {
    std::string dir = executable_dir();
    candidates.push_back(dir + "/libckptool_torch.so");
    candidates.push_back(dir + "/../lib/ckptool/libckptool_torch.so");
  }
  std::string errors;
  for (const auto& path : candidates) {
    if (::access(path.c_str(), F_OK) != 0) continue;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = ::dlerror();
      errors += std::string(errors.empty() ? "" : "; ") + (why ? why : path);
      continue;
    }
    auto entry = reinterpret_cast<const torch_plugin_api* (*)()>(::dlsym(handle, "ckptool_torch_plugin"));
    if (!entry) throw error(errc::unsupported, path + " is not a ckptool LibTorch plugin");
    const torch_plugin_api* api = entry();
    if (!api || api->abi != kTorchPluginAbi)
      throw error(errc::unsupported, path + " was built for another ckptool version; rebuild ckptool");
    return api;
  }
  throw error(errc::unsupported, "this needs LibTorch, and the plugin libckptool_torch.so " +
                                     std::string(errors.empty() ? "was not found next to ckptool"
                                                                : "could not be loaded: " + errors));
}

}  // namespace

const torch_plugin_api& torch_plugin() {
  static const torch_plugin_api* api = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { api = load(); });
  return *api;
}

}  // namespace ckpt
