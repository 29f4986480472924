#include "io/slice_source.h"

#include <cstring>

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

void slice_source::keep_ends(size_t bytes) {
  if (length_ <= 2 * uint64_t(bytes)) {
    head_ = parent_->read_vector(offset_, size_t(length_));
    tail_.clear();
    return;
  }
  head_ = parent_->read_vector(offset_, bytes);
  tail_ = parent_->read_vector(offset_ + length_ - bytes, bytes);
}

void slice_source::drop_ends() {
  std::vector<uint8_t>().swap(head_);
  std::vector<uint8_t>().swap(tail_);
}

void slice_source::read_impl(uint64_t offset, void* dst, size_t n) const {
  if (offset + n <= head_.size()) {
    std::memcpy(dst, head_.data() + offset, n);
    return;
  }
  if (!tail_.empty() && offset >= length_ - tail_.size()) {
    std::memcpy(dst, tail_.data() + (offset - (length_ - tail_.size())), n);
    return;
  }
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
