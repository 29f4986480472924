// A strict reader of the zip archives torch.save and torch.jit.save write (miniz through
// caffe2's PyTorchStreamWriter): central directory with ZIP64, stored records, deflated
// records (TorchScript compresses code/ records over 200 bytes), data descriptors.
//
// Layout (APPNOTE 6.3.x; formats.md §2.1):
//   [local header 30 B | name | extra ('FB' padding, ZIP64) | data | descriptor?] ...
//   central directory entries (46 B + name + extra + comment) ...
//   [ZIP64 end record 56 B][ZIP64 locator 20 B] end record (22 B + comment)
//
// Stricter than miniz, which is what PyTorch uses, on purpose (security.md §2.B): rejects
// duplicate names, entries outside the single top-level folder, local/central
// disagreement, overlapping records, gaps, encryption or unknown flag bits, sizes past the
// end of the file, ZIP64 sentinels without their extra field, trailing junk and prefixes.
// Only the central directory and the local headers are read when opening.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/byte_source.h"

namespace ckpt::detail {
class string_index;
}

namespace ckpt::zip {

// Names are views into one buffer the archive owns (a million records cost 19 bytes of
// name each, not two std::strings and a heap block): an entry is valid only as long as its
// archive.
struct entry {
  std::string_view name;      // full name, "archive/data.pkl"
  std::string_view record;    // name without the top-level folder, "data.pkl"
  uint16_t method = 0;        // 0 stored, 8 deflated
  uint16_t flags = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;   // first byte of the (possibly compressed) data in the file
  uint64_t end_offset = 0;    // one past the data and its data descriptor, if any
};

enum class crc_outcome {
  match,
  // PyTorch's rule for files saved with CRC computation off
  // (torch.serialization.set_crc32_options(False); checked with torch 2.11): its writer leaves
  // every record's CRC field 0, and torch.load never checks CRCs (miniz is built with
  // MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS), so such files load. A zero CRC on a non-empty
  // record therefore means "not recorded", not "corrupt"; the data is not read. (An empty
  // record's CRC really is 0, and matches.) docs/formats.md, "CRC-32".
  not_recorded,
  mismatch,
};

struct crc_result {
  crc_outcome outcome = crc_outcome::match;
  uint32_t computed = 0;  // the data's CRC-32; 0 when not_recorded
};

struct open_options {
  /// Largest record that read_record() will inflate or copy into memory.
  uint64_t max_record_bytes = 1ull << 31;
  /// Largest total of declared uncompressed sizes of deflated records (zip bombs).
  uint64_t max_inflated_total = 1ull << 32;
};

class archive {
 public:
  /// Parses the central directory and every local header of `src`. Throws ckpt::error
  /// (corrupt/unsupported) with the file offset of the first problem. `src` must outlive
  /// the archive.
  static std::unique_ptr<archive> open(const byte_source& src, const open_options& options = {});
  /// open(), for an archive written to repeat the names of `like` (an archive open()
  /// accepted), as a rewrite of it does: instead of checking that no two names are alike,
  /// it requires exactly `like`'s names in `like`'s order, which rules out duplicates just
  /// as well and builds no index (a read-back of a million records: a tenth of its time).
  /// find() on the result scans the entries.
  static std::unique_ptr<archive> open_like(const byte_source& src, const archive& like,
                                            const open_options& options = {});

  ~archive();
  archive(const archive&) = delete;  // by_record_ finds entries by their own strings
  archive& operator=(const archive&) = delete;

  const std::vector<entry>& entries() const { return entries_; }
  /// The single top-level folder every name starts with ("archive", "model", ...).
  const std::string& prefix() const { return prefix_; }
  /// Lookup by record name relative to the prefix ("data.pkl", "data/0"); nullptr if absent.
  /// By index, but a scan for an archive from open_like().
  const entry* find(std::string_view record) const;
  /// The record's bytes (inflated if needed), size-capped by open_options.
  std::vector<uint8_t> read_record(const entry& e) const;
  /// The one CRC-32 check of a record, used by every verb. Reads the whole record (in
  /// bounded chunks) unless it has no CRC recorded; `progress` gets the number of stored
  /// (compressed) bytes consumed so far. Does not throw on a mismatch: see verify_crc.
  crc_result record_crc(const entry& e, const std::function<void(uint64_t)>& progress = {}) const;
  /// record_crc, throwing errc::corrupt (with the record's data offset) on a mismatch.
  void verify_crc(const entry& e) const;
  const byte_source& source() const { return src_; }

 private:
  archive(const byte_source& src, open_options options);
  const byte_source& src_;
  open_options options_;
  std::vector<entry> entries_;
  std::unique_ptr<char[]> names_;  // every entry's name, back to back; entries view into it
  std::string prefix_;
  std::unique_ptr<detail::string_index> by_record_;  // entries_ by full name (find adds the prefix)
  friend class archive_parser;
};

/// CRC-32 (zlib polynomial), incremental: crc = crc32_update(crc, p, n) starting from 0.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

}  // namespace ckpt::zip
