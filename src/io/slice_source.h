// A part of another source read as a whole input: a DCP chunk is a complete torch.save
// archive embedded at (offset, length) in a `.distcp` file, and the zip reader, the pickle
// machine and the safetensors reader read it as they read a file. Offsets inside the
// slice start at 0; every error raised through it names the parent file and the byte in
// the parent (byte_source::locate), because that is the file and byte a user can look at.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"

namespace ckpt {

class slice_source final : public byte_source {
 public:
  /// Bytes [offset, offset + length) of `parent`, which the slice shares (several chunks
  /// of one `.distcp` file share one open file). Throws errc::corrupt, naming the parent,
  /// when the range does not lie inside it: the range comes from another file's metadata.
  slice_source(std::shared_ptr<const byte_source> parent, uint64_t offset, uint64_t length);

  uint64_t size() const override { return length_; }
  const std::string& name() const override { return parent_->name(); }
  uint64_t origin_offset() const override { return parent_->origin_offset() + offset_; }
  void prefetch(uint64_t offset, size_t n) const override;
  bool resident(uint64_t offset) const override;
  /// A slice of a file is a sub-range of it: mappings of the parent serve the slice.
  file_extent in_file() const override;
  const byte_source& parent() const { return *parent_; }

  /// Reads the first and the last `bytes` of the slice now (one read when they meet) and
  /// serves reads that lie inside either from memory: a zip archive's reader asks for its
  /// end records, central directory and local headers there in a dozen small reads, which
  /// for a DCP directory's thousands of chunk archives were most of the time to open it.
  /// Not thread-safe against reads running meanwhile: call it before handing the slice out.
  void keep_ends(size_t bytes);
  /// Lets the kept ends go (a directory of 100,000 chunks would hold 200 MB of them).
  void drop_ends();

 protected:
  void read_impl(uint64_t offset, void* dst, size_t n) const override;

 private:
  std::shared_ptr<const byte_source> parent_;
  uint64_t offset_;
  uint64_t length_;
  std::vector<uint8_t> head_, tail_;  // keep_ends: bytes [0, head_.size()), [length_ - tail_.size(), length_)
};

}  // namespace ckpt
