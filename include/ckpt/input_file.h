// How every input is opened: without blocking, regular files only, with a fingerprint
// that tells whether the file changed while it was being read.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace ckpt {

/// What identifies one state of a file: which file (device, inode) and its size and change
/// times. Any write to the file, or a rename over its path, changes it.
struct file_fingerprint {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  mode_t mode = 0;
  bool operator==(const file_fingerprint& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
  }
  bool operator!=(const file_fingerprint& o) const { return !(*this == o); }
};

/// The fingerprint of a file described by stat(2), or of an open descriptor.
file_fingerprint fingerprint_of(const struct stat& st);
file_fingerprint fingerprint_of(int fd);

/// Opens `path` for reading. O_NONBLOCK keeps the open of a FIFO from waiting for a
/// writer; anything but a regular file (FIFO, device, socket, directory) is refused at
/// once with errc::usage ("not a regular file: a FIFO"). A missing or unreadable file is
/// errc::io. Returns a descriptor (O_CLOEXEC, blocking again) the caller closes.
int open_regular_input(const std::string& path, file_fingerprint* fingerprint = nullptr);

/// The largest JSON input (a --map file) read: 64 MiB, far above a map of a million keys.
constexpr uint64_t kMaxJsonInputBytes = 64ull << 20;

/// A small text input (JSON), read whole: a regular file of at most `max_bytes`
/// (errc::limit beyond), and unchanged while read (errc::io).
std::string read_text_input(const std::string& path, uint64_t max_bytes = kMaxJsonInputBytes);

}  // namespace ckpt
