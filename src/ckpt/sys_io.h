// Every system call that writes output goes through here, so tests can make any one of
// them fail on purpose: CKPTOOL_FAULT_INJECT="OP:N:ERRNO" fails the Nth call of OP
// (open, write, fsync, rename, dirfsync, close) with ERRNO (ENOSPC, EIO, EDQUOT).
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace ckpt {

/// The system calls the writers make, in one place so failures can be injected.
namespace sys {
int open(const char* path, int flags, mode_t mode);
ssize_t write(int fd, const void* buf, size_t n);
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset);
int fsync(int fd);
int rename(const char* from, const char* to);
int close(int fd);
/// copy_file_range(2); counts as a "write" for fault injection.
ssize_t copy_file_range(int fd_in, off_t* off_in, int fd_out, off_t* off_out, size_t n);
/// The next fsync() is the directory's (so "dirfsync" faults can target it).
void mark_next_fsync_as_directory();
/// Counts calls per operation and fails the Nth of one kind with the given errno, when
/// CKPTOOL_FAULT_INJECT="OP:N:ERRNO" is set (OP: open, write, fsync, rename, dirfsync,
/// close; ERRNO: ENOSPC, EIO, ...). Read once, at first use.
void load_fault_injection_from_env();
}  // namespace sys

}  // namespace ckpt
