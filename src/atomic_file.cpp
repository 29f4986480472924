#include "ckpt/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>
#include <algorithm>

#include "ckpt/error.h"

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
  plan().err = err == "ENOSPC" ? ENOSPC : err == "EIO" ? EIO : err == "EDQUOT" ? EDQUOT : err == "EINTR" ? EINTR : EIO;
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
int rename(const char* from, const char* to) {
  if (inject(kRename)) return -1;
  return ::rename(from, to);
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

namespace {

// The temporary file of the write in progress, for the signal handler: only one output
// is written at a time by the CLI, and unlink() is async-signal-safe.
char g_temp_for_signal[4096];
std::atomic<bool> g_handlers_installed{false};

void remove_temp_and_reraise(int sig) {
  if (g_temp_for_signal[0]) ::unlink(g_temp_for_signal);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_signal_handlers() {
  if (g_handlers_installed.exchange(true)) return;
  std::signal(SIGINT, remove_temp_and_reraise);
  std::signal(SIGTERM, remove_temp_and_reraise);
  std::signal(SIGHUP, remove_temp_and_reraise);
}

std::string directory_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err) {
  throw error(errc::io, what + ": " + std::strerror(err)).with_file(path);
}

}  // namespace

void write_all(int fd, const void* buf, size_t n, const std::string& what) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t w = sys::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_fail("write failed", what, errno);
    }
    p += w;
    n -= size_t(w);
  }
}

void copy_range(int in_fd, uint64_t offset, uint64_t n, int out_fd, const std::string& what,
                const std::function<void(uint64_t)>& on_copied) {
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
        io_fail("copy failed", what, errno);
      kernel = false;  // not supported here, or the source ended: let the buffered path tell
    }
    if (buf.empty()) buf.resize(1 << 20);
    size_t want = std::min(chunk, buf.size());
    ssize_t got = ::pread(in_fd, buf.data(), want, off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      io_fail("read failed", what, errno);
    }
    if (got == 0) throw error(errc::corrupt, "input ended while copying", offset).with_file(what);
    write_all(out_fd, buf.data(), size_t(got), what);
    advance(uint64_t(got));
  }
}

atomic_output::atomic_output(std::string destination, mode_t mode)
    : destination_(std::move(destination)), directory_(directory_of(destination_)) {
  if (destination_.empty() || destination_.back() == '/')
    throw error(errc::usage, "output path names a directory").with_file(destination_);
  std::random_device rd;
  std::mt19937_64 rng(rd());
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
    temp_ = directory_ + "/." + base_name(destination_) + ".ckptool-" + suffix;
    fd_ = sys::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd_ < 0 && errno != EEXIST) io_fail("cannot create a temporary file next to the output", destination_, errno);
  }
  if (fd_ < 0) io_fail("cannot create a temporary file next to the output", destination_, EEXIST);
  install_signal_handlers();
  std::strncpy(g_temp_for_signal, temp_.c_str(), sizeof g_temp_for_signal - 1);
}

atomic_output::~atomic_output() {
  if (!committed_) discard();
}

void atomic_output::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  g_temp_for_signal[0] = 0;
}

void atomic_output::start_writeback(uint64_t bytes_out) {
#ifdef SYNC_FILE_RANGE_WRITE
  // Batches of 16 MiB keep the disk streaming without a system call per small record.
  constexpr uint64_t kBatch = 16 << 20;
  if (!writeback_hint_works_ || fd_ < 0 || bytes_out < writeback_started_ + kBatch) return;
  if (::sync_file_range(fd_, off_t(writeback_started_), off_t(bytes_out - writeback_started_),
                        SYNC_FILE_RANGE_WRITE) != 0)
    writeback_hint_works_ = false;  // e.g. a pipe or an unusual file system; fsync still runs
  writeback_started_ = bytes_out;
#else
  (void)bytes_out;
#endif
}

void atomic_output::commit() {
  try {
    // Without the fsync a crash after the rename can leave an empty file at the
    // destination (Ts'o; renameio).
    if (sys::fsync(fd_) != 0) io_fail("fsync failed", destination_, errno);
    int fd = fd_;
    fd_ = -1;
    if (sys::close(fd) != 0) io_fail("close failed", destination_, errno);
    if (sys::rename(temp_.c_str(), destination_.c_str()) != 0) io_fail("rename failed", destination_, errno);
  } catch (...) {
    discard();
    throw;
  }
  committed_ = true;
  g_temp_for_signal[0] = 0;
  // The rename is only durable once the directory is. The new file is complete either
  // way, so a failure here is reported but the output stays.
  int dir = ::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) io_fail("cannot open the output directory to sync it", destination_, errno);
  sys::mark_next_fsync_as_directory();
  int rc = sys::fsync(dir);
  int err = errno;
  ::close(dir);
  if (rc != 0) io_fail("fsync of the output directory failed", destination_, err);
}

void refuse_overwriting_input(const std::string& input, const std::string& output, bool force) {
  struct stat in, out;
  if (::stat(input.c_str(), &in) != 0) return;  // the reader reports a missing input
  // stat follows symlinks: a link to the input, or a hard link, has the same identity.
  if (::stat(output.c_str(), &out) != 0) return;
  if (in.st_dev == out.st_dev && in.st_ino == out.st_ino && !force)
    throw error(errc::usage, "output " + output + " is the input file (same path, hard link or symlink); "
                             "pass --force to replace it (it is replaced only once the new file is complete)")
        .with_file(input);
}

}  // namespace ckpt
