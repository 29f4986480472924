// Internal: fills untouched anonymous pages straight from a readable mapping of the file
// (userfaultfd UFFDIO_COPY).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ckpt/byte_source.h"

namespace ckpt::detail {

class page_filler {
 public:
  /// nullptr where userfaultfd cannot be used (old kernel, seccomp, privileges): the
  /// caller reads with pread instead.
  static std::unique_ptr<page_filler> open();
  /// Closing the descriptor drops every registration still held.
  ~page_filler();
  page_filler(const page_filler&) = delete;
  page_filler& operator=(const page_filler&) = delete;

  /// Claims [pages, pages + length), page-aligned, anonymous and never touched. Until
  /// remove() or destruction, only fill() may write there: a plain access would wait
  /// forever for a page nobody supplies. False: not claimed, read it another way.
  bool add(void* pages, size_t length);
  void remove(void* pages, size_t length);

  /// Copies `length` bytes (a page multiple) from `src` into claimed `dst` (page-aligned).
  /// Throws errc::io when the source cannot be read (a file shrunk under its mapping).
  void fill(void* dst, const void* src, size_t length);

  /// Fills the claimed page `page` with `n` bytes read from `src` at `offset`, placed
  /// `in_page` bytes into it; the rest of the page is zero. For a page that holds bytes
  /// outside what is loaded (before a slice, past the end of the file), read with pread so
  /// that a file shrunk meanwhile is an error, not SIGBUS.
  void fill_part(void* page, size_t in_page, const byte_source& src, uint64_t offset, size_t n);

 private:
  explicit page_filler(int fd) : fd_(fd) {}
  int fd_;
};

/// A read-only shared mapping of a whole file, the filler's usual source; unmapped when the
/// last owner lets go. nullptr when the file cannot be mapped: read it another way.
std::shared_ptr<uint8_t> map_whole_file(int fd, uint64_t size);

}  // namespace ckpt::detail
