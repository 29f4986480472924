// The system-call seam of the writers (ckpt/sys_io.h): fault injection for tests, and the
// plain write/copy loops every output shares.
#include "ckpt/sys_io.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "base/fail.h"

namespace ckpt {
namespace sys {
namespace {

enum op { kOpen, kWrite, kFsync, kRename, kDirFsync, kClose, kOps };
const char* const kOpNames[kOps] = {"open", "write", "fsync", "rename", "dirfsync", "close"};

struct fault_plan {
  int op = -1;
  uint64_t nth = 0;
  int err = 0;
  std::atomic<uint64_t> calls[kOps] = {};
};

fault_plan& plan() {
  static fault_plan p;
  return p;
}

std::once_flag g_loaded;

// True when this call of `o` is the one to fail (errno set).
bool inject(op o) {
  std::call_once(g_loaded, load_fault_injection_from_env);
  fault_plan& p = plan();
  uint64_t n = p.calls[o].fetch_add(1) + 1;
  if (p.op == o && n == p.nth) {
    errno = p.err;
    return true;
  }
  return false;
}

thread_local bool g_next_fsync_is_dir = false;

}  // namespace

void load_fault_injection_from_env() {
  const char* spec = std::getenv("CKPTOOL_FAULT_INJECT");
  if (!spec || !*spec) return;
  std::string s(spec);
  size_t a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) return;
  std::string name = s.substr(0, a), nth = s.substr(a + 1, b - a - 1), err = s.substr(b + 1);
  for (int i = 0; i < kOps; ++i)
    if (name == kOpNames[i]) plan().op = i;
  plan().nth = std::strtoull(nth.c_str(), nullptr, 10);
  plan().err = err == "ENOSPC"  ? ENOSPC
               : err == "EIO"   ? EIO
               : err == "EDQUOT" ? EDQUOT
               : err == "EINTR" ? EINTR
               : err == "EPIPE" ? EPIPE
               : err == "EINVAL" ? EINVAL
                                 : EIO;
}

void kill_point(const char* name) {
  const char* at = std::getenv("CKPTOOL_TEST_KILL_AT");
  if (at && std::strcmp(at, name) == 0) ::kill(::getpid(), SIGKILL);
}

int open(const char* path, int flags, mode_t mode) {
  if (inject(kOpen)) return -1;
  return ::open(path, flags, mode);
}
ssize_t write(int fd, const void* buf, size_t n) {
  if (inject(kWrite)) return -1;
  return ::write(fd, buf, n);
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) {
  if (inject(kWrite)) return -1;
  return ::pwrite(fd, buf, n, offset);
}
int fsync(int fd) {
  bool dir = g_next_fsync_is_dir;
  g_next_fsync_is_dir = false;
  if (inject(dir ? kDirFsync : kFsync)) return -1;
  return ::fsync(fd);
}
int rename(const char* from, const char* to, unsigned flags) {
  if (inject(kRename)) return -1;
  return ::renameat2(AT_FDCWD, from, AT_FDCWD, to, flags);
}
ssize_t copy_file_range(int fd_in, off_t* off_in, int fd_out, off_t* off_out, size_t n) {
  if (inject(kWrite)) return -1;
  return ::copy_file_range(fd_in, off_in, fd_out, off_out, n, 0);
}
int close(int fd) {
  if (inject(kClose)) {
    ::close(fd);  // the descriptor is gone either way, as with a real failed close
    return -1;
  }
  return ::close(fd);
}

void mark_next_fsync_as_directory() { g_next_fsync_is_dir = true; }

}  // namespace sys

void write_all(int fd, const void* buf, size_t n, const std::string& what) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t w = sys::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      detail::fail_io("write failed", what, errno);
    }
    if (w == 0) detail::fail_io("write failed", what, EIO);
    p += w;
    n -= size_t(w);
  }
}

void copy_range(int in_fd, const std::string& in_name, uint64_t offset, uint64_t n, int out_fd,
                const std::string& out_name, const std::function<void(uint64_t)>& on_copied) {
  bool kernel = true;
  std::vector<uint8_t> buf;
  uint64_t copied = 0;
  auto advance = [&](uint64_t got) {
    offset += got;
    n -= got;
    copied += got;
    if (on_copied) on_copied(copied);
  };
  while (n > 0) {
    size_t chunk = size_t(std::min<uint64_t>(n, 16ull << 20));
    if (kernel) {
      off_t in = off_t(offset);
      ssize_t got = sys::copy_file_range(in_fd, &in, out_fd, nullptr, chunk);
      if (got > 0) {
        advance(uint64_t(got));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP &&
          errno != EBADF && errno != EPERM)
        detail::fail_io("copy failed", out_name, errno);
      kernel = false;  // not supported here (a pipe, a device), or the source ended: the buffered path tells
    }
    if (buf.empty()) buf.resize(1 << 20);
    size_t want = std::min(chunk, buf.size());
    ssize_t got = ::pread(in_fd, buf.data(), want, off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      detail::fail_io("read failed", in_name, errno);
    }
    if (got == 0) throw error(errc::io, "ended while being copied (changed while being read)", offset).with_file(in_name);
    write_all(out_fd, buf.data(), size_t(got), out_name);
    advance(uint64_t(got));
  }
}

}  // namespace ckpt
