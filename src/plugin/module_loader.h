// Opening ckptool's own LibTorch modules (libckptool_torch.so, libckptool_torch_cuda.so)
// with dlopen: one search and one compatibility rule for both.
//
// A module is compatible only if it was built from the same shared headers as the code
// opening it: each module exports ckptool_module_build_id() (CKPTOOL_MODULE_EXPORT_BUILD_ID
// below), a hash of those headers computed by the build (cmake/build_id.cmake), and the
// loader compares it with its own before touching any entry point.
#pragma once

#include <string>
#include <vector>

#include "ckpt/build_id.h"

namespace ckpt {

struct module_entry {
  void* entry = nullptr;  // the entry point, or null and `problem` says why
  std::string path;       // the file that was opened, when one was
  std::string problem;
  bool named_file_missing = false;  // the environment variable names a file that is not there
};

/// Opens the first of `default_paths` that exists, or the file that `env_variable` names
/// (then nothing else is tried), checks its build id and returns `entry_symbol`.
module_entry open_module(const char* env_variable, const std::vector<std::string>& default_paths,
                         const char* entry_symbol);

/// The directory of the running executable ("." if unknown).
std::string executable_directory();

/// The directory of the shared object that holds `address` ("." if unknown).
std::string directory_of_code_at(const void* address);

}  // namespace ckpt

#define CKPTOOL_MODULE_EXPORT_BUILD_ID                                                          \
  extern "C" __attribute__((visibility("default"))) const char* ckptool_module_build_id() { \
    return CKPTOOL_BUILD_ID;                                                                \
  }
