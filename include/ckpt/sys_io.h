// Every system call that writes output goes through here, so tests can make any one of
// them fail on purpose: CKPTOOL_FAULT_INJECT="OP:N:ERRNO" fails the Nth call of OP
// (open, write, fsync, rename, dirfsync, close) with ERRNO (ENOSPC, EIO, EDQUOT, EPIPE).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace ckpt {

/// The system calls the writers make, in one place so failures can be injected.
namespace sys {
int open(const char* path, int flags, mode_t mode);
ssize_t write(int fd, const void* buf, size_t n);
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset);
int fsync(int fd);
/// renameat2(2) relative to the working directory; flags 0, RENAME_EXCHANGE or
/// RENAME_NOREPLACE. Counts as a "rename".
int rename(const char* from, const char* to, unsigned flags = 0);
int close(int fd);
/// copy_file_range(2); counts as a "write" for fault injection.
ssize_t copy_file_range(int fd_in, off_t* off_in, int fd_out, off_t* off_out, size_t n);
/// The next fsync() is the directory's (so "dirfsync" faults can target it).
void mark_next_fsync_as_directory();
/// Counts calls per operation and fails the Nth of one kind with the given errno, when
/// CKPTOOL_FAULT_INJECT="OP:N:ERRNO" is set (OP: open, write, fsync, rename, dirfsync,
/// close; ERRNO: ENOSPC, EIO, EDQUOT, EPIPE, EINVAL, EINTR). Read once, at first use.
void load_fault_injection_from_env();
/// A point of a commit where a test kills the process (SIGKILL: no handler, no cleanup),
/// to see what another process makes of it: CKPTOOL_TEST_KILL_AT=NAME names the point
/// (output_dir's "before-commit-rename" and "after-commit-rename"; parallel convert's
/// "rank-0-staging-known", the first moment rank 0 may write).
void kill_point(const char* name);
}  // namespace sys

/// Writes `buf` fully to `fd` (retrying short writes and EINTR) or throws errc::io naming
/// `what`.
void write_all(int fd, const void* buf, size_t n, const std::string& what);

/// Copies `n` bytes at `offset` of `in_fd` (named `in_name`) to the current position of
/// `out_fd` (named `out_name`), in the kernel where it can (copy_file_range), else through
/// a buffer. Throws errc::io naming the file at fault: the output for a failed write (a
/// full disk), the input for a failed read or one that ends early (it changed while being
/// read). `on_copied`, if set, gets the bytes copied so far after each chunk.
void copy_range(int in_fd, const std::string& in_name, uint64_t offset, uint64_t n, int out_fd,
                const std::string& out_name, const std::function<void(uint64_t)>& on_copied = nullptr);

}  // namespace ckpt
