// Writes zip archives byte for byte the way PyTorch's PyTorchStreamWriter (miniz) does, so
// torch.load and torch.jit.load read them as their own (formats.md §2.1):
//
//   [local header 30 B | "<prefix>/<record>" | ZIP64 extra? | 'FB' padding | data | descriptor?]...
//   central directory | ZIP64 end record (56 B) | ZIP64 locator (20 B) | end record (22 B)
//
//  * records are stored (method 0) in the order added; DOS time and date are 0; version
//    "made by" and "needed" are 0; external attributes are 0;
//  * non-empty records have flags 0x0808 (data descriptor, UTF-8) and zero CRC/sizes in the
//    local header; empty records have flags 0x0800 and no descriptor;
//  * the local extra field is a ZIP64 field (id 1) when the size or the local header offset
//    is >= 0xFFFFFFFF: uncompressed size and a zero compressed size (miniz writes it before
//    it knows the size) if the size is large, then the offset if the offset is large;
//    then 'F' 'B' u16 n and n bytes of 'Z', so the data starts at a multiple of `alignment`
//    (caffe2 getPadding);
//  * the descriptor is "PK\7\8" crc csize usize: 16 bytes, or 24 with 64-bit sizes when the
//    local header has the ZIP64 field;
//  * central entries carry a ZIP64 field with the sizes if the size is >= 0xFFFFFFFF and the
//    offset if the offset is; the 32-bit fields hold 0xFFFFFFFF then;
//  * the ZIP64 end record and locator are always written; the classic end record holds
//    0xFFFF / 0xFFFFFFFF where a value does not fit.
//
// The caller owns the file: the writer writes sequentially through write(2) and treats the
// descriptor's position at construction as archive offset 0, so hand it an empty file (or a
// pipe: only add_record_copy's fast path needs a regular file). Atomic replacement, fsync
// and removing a half-written file on error are the caller's job. Record contents that
// torch expects (data.pkl, version, .data/serialization_id, ...) are the caller's job too.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::zip {

/// Serves byte ranges of a file from windows read in large pieces: records copied in file
/// order cost one system call per window instead of one or two per record.
class source_window {
 public:
  explicit source_window(int fd, size_t window = size_t(4) << 20) : fd_(fd), window_(window) {}
  /// The file's bytes [offset, offset + n), valid until the next call. Throws errc::io when
  /// reading fails or the file ends first.
  const uint8_t* bytes(uint64_t offset, size_t n);

 private:
  int fd_;
  size_t window_;
  uint64_t start_ = 0;
  std::vector<uint8_t> buf_;
};

class writer {
 public:
  static constexpr uint64_t kMaxAlignment = 0x8000;  // the padding length must fit the u16 field
  /// `prefix` is the single top-level folder ("archive"; torch uses the file's basename).
  /// Throws errc::usage for an invalid prefix or an alignment of 0.
  writer(int fd, std::string prefix, uint64_t alignment = 64);
  /// Does not finish the archive: without finish() the output is not a valid zip.
  ~writer() = default;
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  /// One whole record from memory.
  void add_record(std::string_view record, const void* data, size_t size);
  void add_record(std::string_view record, const std::vector<uint8_t>& bytes) {
    add_record(record, bytes.data(), bytes.size());
  }

  /// A record streamed in pieces: begin_record, write() exactly `size` bytes in total, then
  /// end_record(). The size must be known up front because it decides the header layout.
  void begin_record(std::string_view record, uint64_t size);
  /// A streamed record whose size is not known yet, only that it is at least 1 byte and
  /// below 0xFFFFFFFF: every such size gets the same local header (the sizes and CRC-32 go in
  /// the descriptor after the data), so one pass over the bytes suffices where begin_record
  /// needs a pass to measure them first. write() then end_record(); a write past 0xFFFFFFFE
  /// bytes, or an end_record() after none, throws errc::usage and leaves the archive broken.
  void begin_record_below_4gib(std::string_view record);
  void write(const void* data, size_t n);
  void end_record();
  /// The size and CRC-32 of the record last ended.
  uint64_t last_record_size() const { return central_.empty() ? 0 : central_.back().size; }
  uint32_t last_record_crc32() const { return central_.empty() ? 0 : central_.back().crc32; }

  /// Copies `size` bytes at `src_offset` of `src_fd` into a new record. With `known_crc32`
  /// (the caller asserts the bytes are exactly those it describes, e.g. a stored record whose
  /// CRC the source's central directory gives) the copy goes through copy_file_range(2)
  /// without the bytes passing through user space; otherwise, or where the kernel cannot,
  /// it falls back to pread/write and computes the CRC itself.
  void add_record_copy(std::string_view record, int src_fd, uint64_t src_offset, uint64_t size,
                       std::optional<uint32_t> known_crc32 = std::nullopt);
  /// One whole record from memory whose CRC-32 the caller knows (bytes copied verbatim from
  /// a record the source's central directory describes): the CRC is not computed again.
  void add_record_known_crc(std::string_view record, const void* data, size_t size, uint32_t crc32);

  /// Room for `records` records, so that writing a million does not regrow the index of
  /// their names over and over. Optional.
  void reserve(size_t records);

  /// From now on the caller vouches that no record name repeats (the records are copied
  /// from an archive whose reader refused repeated names, and the result is read back):
  /// names are no longer indexed to refuse a second one. For a million records the index
  /// was a twentieth of rekey's time.
  void trust_unique_names() { trust_names_ = true; }

  /// Writes the central directory and end records. Nothing may be added afterwards.
  void finish();

  /// Bytes written so far (the archive size once finished).
  uint64_t offset() const { return cursor_; }

  /// Called with the number of archive bytes that have reached the file (buffered ones
  /// excluded) after each buffer flush and each copied chunk: drives progress bars and
  /// early writeback, so it must be cheap.
  void on_bytes_out(std::function<void(uint64_t)> callback) { on_bytes_out_ = std::move(callback); }
  /// Archive offset of the data of the most recently begun record.

  /// The padding extra field's payload length for a local header at `cursor` (PyTorch's
  /// getPadding, without the 4-byte 'FB' header): data then starts at a multiple of
  /// `alignment`.
  static uint64_t padding_size(uint64_t cursor, uint64_t name_size, uint64_t size,
                               uint64_t alignment);

 private:
  // A million records must not cost a million strings: names live in one arena.
  struct central_record {
    uint64_t name_offset;  // into names_
    uint64_t size;
    uint64_t local_header_offset;
    uint32_t name_size;
    uint32_t crc32;
    uint16_t flags;
  };
  std::string_view name_of(const central_record& c) const { return {names_.data() + c.name_offset, c.name_size}; }
  /// Adds `name` to the arena and the duplicate index; false if it is there already.
  bool insert_name(std::string_view name);
  void rebuild_name_index(size_t want);

  void check_writable() const;
  void start_entry(std::string_view record, uint64_t size);
  void finish_entry(uint32_t crc);
  void put(const void* data, size_t n);  // buffered
  void flush();
  void write_fully(const void* data, size_t n);
  void copy_range_in_kernel(int src_fd, uint64_t& src_offset, uint64_t& left);
  [[noreturn]] void fail_io(const std::string& what, int err);
  void report_bytes_out() {
    if (on_bytes_out_) on_bytes_out_(cursor_ - buf_.size());
  }

  int fd_;
  std::string prefix_;
  uint64_t alignment_;
  uint64_t cursor_ = 0;  // archive bytes produced, buffered ones included
  std::vector<uint8_t> buf_;
  std::vector<central_record> central_;
  std::string names_;                 // every full name, back to back
  std::vector<uint64_t> name_index_;  // open addressing: hash tag, 1 + index into central_; 0 empty
  bool in_record_ = false;
  uint64_t record_size_ = 0;
  uint64_t record_written_ = 0;
  uint32_t record_crc_ = 0;
  bool record_unsized_ = false;
  bool trust_names_ = false;  // begun by begin_record_below_4gib: record_size_ is the bound
  // Scratch of start_entry, kept across records (a million records, two allocations each).
  std::string entry_name_;
  std::vector<uint8_t> entry_extra_;
  bool finished_ = false;
  bool broken_ = false;  // an I/O error left the output in an unknown state
  std::function<void(uint64_t)> on_bytes_out_;
};

}  // namespace ckpt::zip
