// Writing an output file so that no failure can leave a partial file at the destination
// (security.md W1-W4): the bytes go to a temporary file in the destination's directory,
// which is flushed and fsynced, renamed over the destination, and then the directory is
// fsynced. Until commit() succeeds, the destination is untouched; on any failure, on
// destruction without commit, or on SIGINT/SIGTERM, the temporary file is removed.
//
// Every system call goes through sys_ops, so tests can make any one of them fail
// (CKPTOOL_FAULT_INJECT, see fault_injection_from_env).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "ckpt/sys_io.h"

namespace ckpt {


/// Writes `buf` fully to `fd` (retrying short writes and EINTR) or throws errc::io naming
/// `what`.
void write_all(int fd, const void* buf, size_t n, const std::string& what);

/// Copies `n` bytes at `offset` of `in_fd` to the current position of `out_fd`, in the
/// kernel where it can (copy_file_range), else through a buffer. Throws errc::io naming
/// `what`, or errc::corrupt when the input ends early.
/// `on_copied`, if set, gets the bytes copied so far after each chunk.
void copy_range(int in_fd, uint64_t offset, uint64_t n, int out_fd, const std::string& what,
                const std::function<void(uint64_t)>& on_copied = nullptr);

class atomic_output {
 public:
  /// Creates the temporary file next to `destination`. Throws errc::io on failure.
  explicit atomic_output(std::string destination, mode_t mode = 0644);
  ~atomic_output();
  atomic_output(const atomic_output&) = delete;
  atomic_output& operator=(const atomic_output&) = delete;

  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_; }
  const std::string& destination() const { return destination_; }
  void write(const void* buf, size_t n) { write_all(fd_, buf, n, destination_); }
  /// Tells the file the first `bytes_out` bytes are final, so the kernel can start writing
  /// them to the disk while the rest is still being produced: commit()'s fsync then waits
  /// for the tail only, instead of for the whole file at the end. Only a hint; errors
  /// surface at commit().
  void start_writeback(uint64_t bytes_out);
  /// fsync, close, rename over the destination, fsync the directory. Throws errc::io, in
  /// which case the destination still holds what it held before.
  void commit();

 private:
  void discard() noexcept;
  std::string destination_;
  std::string temp_;
  std::string directory_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t writeback_started_ = 0;  // bytes handed to start_writeback so far
  bool writeback_hint_works_ = true;
};

/// Throws errc::usage unless --force, when writing `output` would replace `input` (same
/// path, a hard link, or a symlink to it). With force the caller still writes through
/// atomic_output, so the input is only replaced once the new file is complete.
void refuse_overwriting_input(const std::string& input, const std::string& output, bool force);

}  // namespace ckpt
