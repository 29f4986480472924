// Every parser reads through byte_source, so the same code runs on files and on in-memory
// bytes in tests, and so a test can count exactly which bytes an operation touched.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ckpt {

class error;
class file_source;

/// Where a source's bytes lie in an open file: its byte 0 is byte `offset` of `file`.
/// Loaders that map or pread the file itself (mmap, page claiming) go through this.
struct file_extent {
  const file_source* file = nullptr;  // null: not backed by a file
  uint64_t offset = 0;
};

class byte_source {
 public:
  virtual ~byte_source() = default;
  virtual uint64_t size() const = 0;
  /// Reads exactly `n` bytes at `offset` into `dst`, or throws ckpt::error: `corrupt` when
  /// the range lies past the end (the input is shorter than its own metadata claims), `io`
  /// when the system call fails. Safe to call from several threads at once.
  void read_exact(uint64_t offset, void* dst, size_t n) const;
  /// Reads a whole range into a new buffer (same errors as read_exact).
  std::vector<uint8_t> read_vector(uint64_t offset, size_t n) const;
  /// Bytes handed out so far: lets tests and `inspect --json` show that tensor data is
  /// never read when only metadata was asked for.
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  /// For readers that bypass read_exact (the CPU loader copies from a mapping of the
  /// file), so the count stays true.
  void count_read(uint64_t n) const { bytes_read_.fetch_add(n, std::memory_order_relaxed); }
  /// The name used in error messages: for a slice, the file it lies in.
  virtual const std::string& name() const = 0;
  /// Where byte 0 of this source is in the file `name()` names (non-zero for a slice).
  virtual uint64_t origin_offset() const { return 0; }
  /// Names this source's file in `e` and turns an offset in this source's coordinates into
  /// one in that file, unless a deeper layer already did: every reader's catch calls this,
  /// so an error inside a slice points at the byte in the file a user can open.
  error& locate(error& e) const;
  /// Where these bytes lie in an open file, if they do.
  virtual file_extent in_file() const { return {}; }
  /// A hint that [offset, offset+n) will be read soon: a file starts fetching it from the
  /// disk in the background, so scattered reads wait for the disk once, not once each.
  virtual void prefetch(uint64_t offset, size_t n) const {
    (void)offset;
    (void)n;
  }
  /// Whether the byte at `offset` can be read without waiting for the disk (true when
  /// this source cannot tell). Decides whether prefetching is worth its system calls.
  virtual bool resident(uint64_t offset) const {
    (void)offset;
    return true;
  }

 protected:
  /// Implementations read [offset, offset+n), already bounds-checked against size().
  virtual void read_impl(uint64_t offset, void* dst, size_t n) const = 0;

 private:
  mutable std::atomic<uint64_t> bytes_read_{0};
};

/// A regular file opened read-only; pread-based, so concurrent reads need no locking.
class file_source final : public byte_source {
 public:
  /// Throws errc::io naming `path` when it cannot be opened or is not a regular file.
  explicit file_source(const std::string& path);
  ~file_source() override;
  file_source(const file_source&) = delete;
  file_source& operator=(const file_source&) = delete;

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return path_; }
  void prefetch(uint64_t offset, size_t n) const override;
  bool resident(uint64_t offset) const override;
  file_extent in_file() const override { return {this, 0}; }
  int fd() const { return fd_; }

 protected:
  void read_impl(uint64_t offset, void* dst, size_t n) const override;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// Bytes held in memory (tests, fuzzers, and records already inflated).
class memory_source final : public byte_source {
 public:
  explicit memory_source(std::vector<uint8_t> bytes, std::string name = "<memory>");
  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 protected:
  void read_impl(uint64_t offset, void* dst, size_t n) const override;

 private:
  std::vector<uint8_t> bytes_;
  std::string name_;
};

}  // namespace ckpt
