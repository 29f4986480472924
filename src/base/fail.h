// Internal: the two errors the file-writing code throws most, worded one way everywhere.
#pragma once

#include <cstring>
#include <string>

#include "ckpt/error.h"

namespace ckpt::detail {

/// An I/O failure on `path`: "WHAT: strerror(err)", exit code io.
[[noreturn]] inline void fail_io(const std::string& what, const std::string& path, int err) {
  throw error(errc::io, what + ": " + std::strerror(err)).with_file(path);
}

/// A refusal of what the command line asked for at `path`, exit code usage.
[[noreturn]] inline void fail_usage(const std::string& what, const std::string& path) {
  throw error(errc::usage, what).with_file(path);
}

}  // namespace ckpt::detail
