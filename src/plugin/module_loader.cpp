#include "plugin/module_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ckpt {
namespace {

std::string directory_part(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// dlopen(RTLD_LOCAL): the module's own symbols stay its own; only what the loader asks for
// by name is shared. The shared libraries it depends on (libckpt_core.so, libckpt_torch.so)
// are the ones already in the process, so their code exists once.
module_entry open_one(const std::string& path, const char* entry_symbol) {
  module_entry out;
  out.path = path;
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    out.problem = why ? why : path + ": cannot be loaded";
    return out;
  }
  using id_fn = const char* (*)();
  auto id = reinterpret_cast<id_fn>(::dlsym(handle, "ckptool_module_build_id"));
  const char* module_id = id ? id() : nullptr;
  if (!module_id || std::strcmp(module_id, CKPTOOL_BUILD_ID) != 0) {
    out.problem = path + " was built for another ckptool (build " + (module_id ? module_id : "unknown") +
                  ", this ckptool is build " CKPTOOL_BUILD_ID "); rebuild or reinstall ckptool";
    return out;
  }
  out.entry = ::dlsym(handle, entry_symbol);
  if (!out.entry) out.problem = path + ": no entry point " + entry_symbol;
  return out;
}

}  // namespace

module_entry open_module(const char* env_variable, const std::vector<std::string>& default_paths,
                         const char* entry_symbol) {
  if (const char* named = std::getenv(env_variable); named && *named) {
    // The user named this file: not finding it is its own error, and nothing is tried in
    // its place.
    if (::access(named, F_OK) != 0) {
      module_entry out;
      out.path = named;
      out.problem = std::string(env_variable) + "=" + named + ": " + std::strerror(errno);
      out.named_file_missing = true;
      return out;
    }
    return open_one(named, entry_symbol);
  }
  std::string problems;
  for (const auto& path : default_paths) {
    if (::access(path.c_str(), F_OK) != 0) continue;
    module_entry found = open_one(path, entry_symbol);
    if (found.entry) return found;
    problems += (problems.empty() ? "" : "; ") + found.problem;
  }
  module_entry out;
  out.problem = problems;  // empty: no candidate exists
  return out;
}

std::string executable_directory() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  return directory_part(std::string(buf, size_t(n)));
}

std::string directory_of_code_at(const void* address) {
  Dl_info info{};
  if (::dladdr(address, &info) == 0 || !info.dli_fname) return ".";
  return directory_part(info.dli_fname);
}

}  // namespace ckpt
