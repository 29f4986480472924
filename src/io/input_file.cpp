#include "ckpt/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ckpt/error.h"

namespace ckpt {
namespace {

const char* kind_phrase(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

file_fingerprint fingerprint_of(const struct stat& st) {
  file_fingerprint f;
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  f.size = int64_t(st.st_size);
  f.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  f.ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  f.mode = st.st_mode;
  return f;
}

file_fingerprint fingerprint_of(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw error(errc::io, std::string("cannot stat: ") + std::strerror(errno));
  return fingerprint_of(st);
}

int open_regular_input(const std::string& path, file_fingerprint* fingerprint) {
  if (path.empty()) throw error(errc::usage, "empty file name");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    // A socket cannot be opened at all: say what it is rather than "No such device".
    struct stat st;
    if (e == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw error(errc::usage, std::string("not a regular file: ") + kind_phrase(st.st_mode)).with_file(path);
    throw error(errc::io, std::string("cannot open: ") + std::strerror(e)).with_file(path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw error(errc::io, std::string("cannot stat: ") + std::strerror(e)).with_file(path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw error(errc::usage, std::string("not a regular file: ") + kind_phrase(st.st_mode)).with_file(path);
  }
  // Regular files never block; the flag is cleared so that nothing downstream sees EAGAIN.
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (fingerprint) *fingerprint = fingerprint_of(st);
  return fd;
}

std::string read_text_input(const std::string& path, uint64_t max_bytes) {
  file_fingerprint before;
  int fd = open_regular_input(path, &before);
  std::string text;
  try {
    if (uint64_t(before.size) > max_bytes)
      throw error(errc::limit, std::to_string(before.size) + " bytes; the limit for a JSON input is " +
                                   std::to_string(max_bytes))
          .with_file(path);
    text.resize(size_t(before.size));
    size_t done = 0;
    while (done < text.size()) {
      ssize_t got = ::read(fd, &text[done], text.size() - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw error(errc::io, std::string("read failed: ") + std::strerror(errno)).with_file(path);
      if (got == 0) break;
      done += size_t(got);
    }
    char extra;
    if (done != text.size() || ::read(fd, &extra, 1) != 0 || fingerprint_of(fd) != before)
      throw error(errc::io, "changed while being read").with_file(path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

}  // namespace ckpt
