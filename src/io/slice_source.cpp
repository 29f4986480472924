#include "io/slice_source.h"

#include "ckpt/error.h"

namespace ckpt {

slice_source::slice_source(std::shared_ptr<const byte_source> parent, uint64_t offset, uint64_t length)
    : parent_(std::move(parent)), offset_(offset), length_(length) {
  uint64_t end;
  if (__builtin_add_overflow(offset, length, &end) || end > parent_->size()) {
    error e(errc::corrupt,
            "an embedded part of " + std::to_string(length) + " bytes at this offset lies past the end of the " +
                std::to_string(parent_->size()) + "-byte input",
            offset);
    throw parent_->locate(e);
  }
}

void slice_source::read_impl(uint64_t offset, void* dst, size_t n) const {
  // Bounds were checked against the slice; the parent's own checks and errors then speak
  // in its coordinates, which is what a message should show.
  parent_->read_exact(offset_ + offset, dst, n);
}

void slice_source::prefetch(uint64_t offset, size_t n) const {
  if (offset < length_) parent_->prefetch(offset_ + offset, n);
}

bool slice_source::resident(uint64_t offset) const { return parent_->resident(offset_ + offset); }

file_extent slice_source::in_file() const {
  file_extent e = parent_->in_file();
  if (e.file) e.offset += offset_;
  return e;
}

}  // namespace ckpt
