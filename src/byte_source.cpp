#include "ckpt/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ckpt/error.h"

namespace ckpt {

void byte_source::read_exact(uint64_t offset, void* dst, size_t n) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, uint64_t(n), &end) || end > size())
    throw error(errc::corrupt,
                "truncated: needs " + std::to_string(n) + " bytes at this offset but the input has " +
                    std::to_string(size()) + " bytes",
                offset)
        .with_file(name());
  if (n == 0) return;
  read_impl(offset, dst, n);
  bytes_read_.fetch_add(n, std::memory_order_relaxed);
}

std::vector<uint8_t> byte_source::read_vector(uint64_t offset, size_t n) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, uint64_t(n), &end) || end > size())
    read_exact(offset, nullptr, n);  // throws the truncation error before allocating
  std::vector<uint8_t> out(n);
  read_exact(offset, out.data(), n);
  return out;
}

file_source::file_source(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw error(errc::io, std::string("cannot open: ") + std::strerror(errno)).with_file(path);
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int e = errno;
    ::close(fd_);
    throw error(errc::io, std::string("cannot stat: ") + std::strerror(e)).with_file(path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw error(errc::io, "not a regular file").with_file(path);
  }
  size_ = uint64_t(st.st_size);
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

memory_source::memory_source(std::vector<uint8_t> bytes, std::string name)
    : bytes_(std::move(bytes)), name_(std::move(name)) {}

void memory_source::read_impl(uint64_t offset, void* dst, size_t n) const {
  std::memcpy(dst, bytes_.data() + offset, n);
}

}  // namespace ckpt
