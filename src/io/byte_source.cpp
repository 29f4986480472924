#include "ckpt/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ckpt/error.h"
#include "ckpt/input_file.h"

namespace ckpt {

void byte_source::read_exact(uint64_t offset, void* dst, size_t n) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, uint64_t(n), &end) || end > size()) {
    // In a slice, "the input" is the embedded part: say where in the file it ends.
    const std::string has = origin_offset() == 0
                                ? "the input has " + std::to_string(size()) + " bytes"
                                : "the embedded part it lies in ends at byte " +
                                      std::to_string(origin_offset() + size());
    error e(errc::corrupt, "truncated: needs " + std::to_string(n) + " bytes at this offset but " + has, offset);
    throw locate(e);
  }
  if (n == 0) return;
  read_impl(offset, dst, n);
  bytes_read_.fetch_add(n, std::memory_order_relaxed);
}

error& byte_source::locate(error& e) const { return e.with_file(name(), origin_offset()); }

std::vector<uint8_t> byte_source::read_vector(uint64_t offset, size_t n) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, uint64_t(n), &end) || end > size())
    read_exact(offset, nullptr, n);  // throws the truncation error before allocating
  std::vector<uint8_t> out(n);
  read_exact(offset, out.data(), n);
  return out;
}

file_source::file_source(const std::string& path) : path_(path) {
  file_fingerprint f;
  fd_ = open_regular_input(path, &f);
  size_ = uint64_t(f.size);
}

file_source::~file_source() {
  if (fd_ >= 0) ::close(fd_);
}

void file_source::read_impl(uint64_t offset, void* dst, size_t n) const {
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd_, out, n, off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw error(errc::io, std::string("read failed: ") + std::strerror(errno), offset).with_file(path_);
    }
    if (got == 0)
      throw error(errc::io, "file shrank while being read", offset).with_file(path_);
    out += got;
    offset += uint64_t(got);
    n -= size_t(got);
  }
}

void file_source::prefetch(uint64_t offset, size_t n) const {
  // Only a hint: a failure here shows up, if it matters, in the read that follows.
  if (offset < size_) (void)::posix_fadvise(fd_, off_t(offset), off_t(n), POSIX_FADV_WILLNEED);
}

bool file_source::resident(uint64_t offset) const {
  if (offset >= size_) return true;
  // RWF_NOWAIT fails with EAGAIN instead of waiting for the disk. Kernels or file systems
  // without it fail otherwise; then nothing is known, and nothing is prefetched.
  uint8_t byte;
  struct iovec v = {&byte, 1};
  ssize_t got = ::preadv2(fd_, &v, 1, off_t(offset), RWF_NOWAIT);
  return !(got < 0 && errno == EAGAIN);
}

memory_source::memory_source(std::vector<uint8_t> bytes, std::string name)
    : bytes_(std::move(bytes)), name_(std::move(name)) {}

void memory_source::read_impl(uint64_t offset, void* dst, size_t n) const {
  std::memcpy(dst, bytes_.data() + offset, n);
}

}  // namespace ckpt
