// Strict zip reader (contract and layout in ckpt/zip_reader.h; hazards Z1-Z13 in
// docs/security.md §2.B). Opening reads the end records, the central directory in one read,
// and each local header together with the previous entry's data descriptor in one read;
// record data is only touched by read_record() and record_crc().
#include "ckpt/zip_reader.h"

#include <sys/resource.h>

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <new>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "base/byteio.h"
#include "ckpt/error.h"
#include "zip/zip_format.h"
#include "base/string_index.h"
#include "base/text.h"
#include "zip/zip_names.h"

namespace ckpt::zip {
namespace {

using namespace format;

constexpr size_t kMaxCommentSize = 0xFFFF;

constexpr uint16_t kFlagEncrypted = 0x0001;
constexpr uint16_t kFlagStrongEncryption = 0x0040;
constexpr uint16_t kFlagMaskedHeaders = 0x2000;
constexpr uint16_t kAllowedFlags = kFlagDescriptor | kFlagUtf8;
// Bits APPNOTE defines (compression options, enhanced deflate, patched data) that we do not
// handle; the rest are reserved and mean the entry is not what it claims.
constexpr uint16_t kDefinedFlags = 0x0002 | 0x0004 | 0x0010 | 0x0020;

constexpr uint16_t kMethodStored = 0;
constexpr uint16_t kMethodDeflate = 8;
// From this many records up, local headers are read by several threads (see
// read_local_headers); below it a thread costs more than it saves.
constexpr size_t kParallelHeaderEntries = 2048;

// Deflate cannot expand better than 258 bytes per two bits; anything that claims more is lying
// about its size, and we refuse it before allocating for it.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint64_t kDeflateSlack = 1024;

// torch.save pads data to 64 bytes; we use its formula to guess the local extra length so a
// torch archive's header comes in one read (formats.md §2.1, getPadding).
constexpr uint64_t kTorchAlignment = 64;

constexpr size_t kIoChunk = 1 << 20;

using text::hex;
using text::quote;

// How far ahead one read of local headers may reach (see load_window).
constexpr uint64_t kHeaderWindow = 256 << 10;

[[noreturn]] void corrupt(const std::string& msg, uint64_t offset) {
  throw_corrupt("zip: " + msg, offset);
}
[[noreturn]] void unsupported(const std::string& msg, uint64_t offset) {
  throw_unsupported("zip: " + msg, offset);
}

uint64_t add(uint64_t a, uint64_t b, const char* what, uint64_t offset) {
  uint64_t r;
  if (!checked_add(a, b, &r)) corrupt(std::string(what) + " overflows 64 bits", offset);
  return r;
}

const char* method_name(uint16_t m) {
  switch (m) {
    case 1: return "shrink";
    case 6: return "implode";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "lzma";
    case 93: return "zstd";
    case 95: return "xz";
    case 98: return "ppmd";
    case 99: return "aes";
    default: return "unknown";
  }
}

// Names are never used as paths, but a name another tool would resolve differently from us is
// how archive confusion starts (Z10), so only plain relative names pass.
void check_name(std::string_view name, uint16_t flags, uint64_t offset) {
  if (const char* why = name_problem(name)) corrupt("entry name " + quote(name) + " " + why, offset);
  if (flags & kFlagUtf8) {
    if (!valid_utf8(name)) corrupt("entry name " + quote(name) + " is not valid UTF-8", offset);
  } else {
    // Without bit 11 the name is CP437 and other readers would decode high bytes differently.
    for (char c : name)
      if (static_cast<unsigned char>(c) >= 0x80)
        corrupt("entry name " + quote(name) + " is not ASCII and lacks the UTF-8 flag", offset);
  }
}

void check_attributes(std::string_view name, uint16_t made_by, uint32_t external, uint64_t offset) {
  constexpr uint32_t kDosDirectory = 0x10;
  constexpr uint8_t kHostUnix = 3, kHostOsx = 19;
  constexpr uint32_t kTypeMask = 0170000, kTypeDir = 0040000, kTypeLink = 0120000;
  if (external & kDosDirectory) corrupt("entry " + quote(name) + " is a directory", offset);
  uint8_t host = uint8_t(made_by >> 8);
  if (host == kHostUnix || host == kHostOsx) {
    uint32_t type = (external >> 16) & kTypeMask;
    if (type == kTypeLink) corrupt("entry " + quote(name) + " is a symbolic link", offset);
    if (type == kTypeDir) corrupt("entry " + quote(name) + " is a directory", offset);
  }
}

void check_encryption(std::string_view name, uint16_t flags, uint64_t offset) {
  if (flags & (kFlagEncrypted | kFlagStrongEncryption | kFlagMaskedHeaders))
    unsupported("encrypted entry " + quote(name) + " (flags " + hex(flags) + ")", offset);
}

void check_flags(std::string_view name, uint16_t flags, uint64_t offset) {
  uint16_t extra = flags & ~kAllowedFlags;
  if (extra & ~kDefinedFlags)
    corrupt("entry " + quote(name) + " has reserved flag bits " + hex(extra & ~kDefinedFlags),
            offset);
  if (extra) unsupported("entry " + quote(name) + " uses flag bits " + hex(extra), offset);
}

// Extra fields must tile the extra area exactly; returns the ZIP64 field's payload, if any.
struct extra_field {
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool present = false;
};

extra_field find_zip64_extra(const uint8_t* p, size_t n, std::string_view name, uint64_t offset) {
  extra_field z;
  size_t pos = 0;
  while (pos < n) {
    if (n - pos < 4) corrupt("extra field of " + quote(name) + " ends in a partial header", offset);
    uint16_t id = load_u16(p + pos);
    uint16_t len = load_u16(p + pos + 2);
    if (n - pos - 4 < len)
      corrupt("extra field " + hex(id) + " of " + quote(name) + " runs past the extra area", offset);
    if (id == kZip64ExtraId) {
      if (z.present) corrupt("entry " + quote(name) + " has two ZIP64 extra fields", offset);
      z.present = true;
      z.data = p + pos + 4;
      z.size = len;
    }
    pos += 4 + size_t(len);
  }
  return z;
}

// Reads the ZIP64 values APPNOTE 4.5.3 says are present: exactly those whose 32-bit (or 16-bit
// disk) field holds the sentinel, in the fixed order usize, csize, offset, disk.
struct zip64_fields {
  uint64_t usize, csize, offset;
  uint32_t disk;
};

zip64_fields resolve_central_zip64(const extra_field& z, uint32_t usize, uint32_t csize,
                                   uint32_t offset, uint16_t disk, std::string_view name, uint64_t at) {
  zip64_fields out{usize, csize, offset, disk};
  bool need_u = usize == kSentinel32, need_c = csize == kSentinel32;
  bool need_o = offset == kSentinel32, need_d = disk == kSentinel16;
  size_t need = 8 * (size_t(need_u) + need_c + need_o) + 4 * size_t(need_d);
  if (need == 0) return out;
  if (!z.present)
    corrupt("central directory entry " + quote(name) + " has a ZIP64 sentinel but no ZIP64 extra field", at);
  // Exactly the announced fields: a longer field would be read differently by readers that
  // take its values by position regardless of the sentinels.
  if (z.size != need)
    corrupt("ZIP64 extra field of " + quote(name) + " has " + std::to_string(z.size) +
                " bytes, its sentinels call for " + std::to_string(need),
            at);
  const uint8_t* p = z.data;
  if (need_u) { out.usize = load_u64(p); p += 8; }
  if (need_c) { out.csize = load_u64(p); p += 8; }
  if (need_o) { out.offset = load_u64(p); p += 8; }
  if (need_d) { out.disk = load_u32(p); }
  return out;
}

// The end records, resolved to 64-bit values.
struct end_info {
  uint64_t entries = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t cd_end = 0;  // where the central directory must end: the ZIP64 end record or the EOCD
};

// Per-entry facts from the central directory that `entry` does not keep.
struct central_extra {
  uint64_t central_offset;
  size_t name_len;
  size_t name_pos;  // in the central directory read (read_central_directory)
};

// zlib's z_stream, ended on every path.
class inflater {
 public:
  inflater() {
    if (inflateInit2(&zs_, -15) != Z_OK) throw std::bad_alloc();
  }
  ~inflater() { inflateEnd(&zs_); }
  inflater(const inflater&) = delete;
  inflater& operator=(const inflater&) = delete;
  z_stream* get() { return &zs_; }

 private:
  z_stream zs_{};
};

// Inflates e's data. With `whole`, output goes to out[0, uncompressed_size); otherwise `out`
// is a window of `window` bytes reused after each call to `sink`. The stream must produce
// exactly uncompressed_size bytes and consume exactly compressed_size bytes.
template <class Sink>
void inflate_entry(const byte_source& src, const entry& e, uint8_t* out, size_t window, bool whole,
                   Sink&& sink) {
  inflater inf;
  z_stream* zs = inf.get();
  std::vector<uint8_t> in(size_t(std::min<uint64_t>(std::max<uint64_t>(e.compressed_size, 1), kIoChunk)));
  uint64_t in_pos = e.data_offset;
  uint64_t in_left = e.compressed_size;
  uint64_t produced = 0;
  size_t win_pos = 0;
  uint8_t scratch = 0;
  for (;;) {
    if (zs->avail_in == 0 && in_left > 0) {
      size_t n = size_t(std::min<uint64_t>(in.size(), in_left));
      src.read_exact(in_pos, in.data(), n);
      zs->next_in = in.data();
      zs->avail_in = uInt(n);
      in_pos += n;
      in_left -= n;
    }
    uint64_t out_left = e.uncompressed_size - produced;
    uint8_t* dst;
    size_t room;
    if (out_left == 0) {
      // Room for one byte only to learn whether the stream ends here or overflows.
      dst = &scratch;
      room = 1;
    } else if (whole) {
      dst = out + produced;
      room = size_t(std::min<uint64_t>(out_left, std::numeric_limits<uInt>::max()));
    } else {
      if (win_pos == window) win_pos = 0;
      dst = out + win_pos;
      room = size_t(std::min<uint64_t>(out_left, window - win_pos));
    }
    zs->next_out = dst;
    zs->avail_out = uInt(room);
    int rc = inflate(zs, Z_NO_FLUSH);
    size_t got = room - zs->avail_out;
    if (dst == &scratch && got > 0)
      corrupt("entry " + quote(e.name) + " inflates to more than its declared " +
                  std::to_string(e.uncompressed_size) + " bytes",
              e.data_offset);
    if (got > 0) {
      if (!whole) sink(dst, got);
      produced += got;
      win_pos += got;
    }
    if (rc == Z_STREAM_END) break;
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs->avail_in == 0 && in_left == 0)
      corrupt("deflate data of " + quote(e.name) + " ends before its stream does", e.data_offset);
    if (rc == Z_MEM_ERROR) throw std::bad_alloc();
    corrupt("invalid deflate data in " + quote(e.name) + (zs->msg ? std::string(": ") + zs->msg : ""),
            e.data_offset);
  }
  if (produced != e.uncompressed_size)
    corrupt("entry " + quote(e.name) + " inflates to " + std::to_string(produced) +
                " bytes, the central directory says " + std::to_string(e.uncompressed_size),
            e.data_offset);
  if (zs->avail_in != 0 || in_left != 0)
    corrupt("deflate stream of " + quote(e.name) + " ends " + std::to_string(zs->avail_in + in_left) +
                " bytes before its compressed data",
            e.data_offset);
  if (whole) sink(out, size_t(produced));
}

}  // namespace

class archive_parser {
 public:
  archive_parser(archive& a, const byte_source& src, const archive* like = nullptr) : a_(a), src_(src), like_(like) {}

  void run() {
    end_info end = read_end();
    read_central_directory(end);
    if (like_)
      check_same_names();
    else
      check_duplicates();
    // Layout before naming policy, so a structural lie is reported as such even in an
    // archive that is not a torch archive at all.
    read_local_headers(end);
    assign_prefix();
    check_totals();
  }

 private:
  // --- end records -------------------------------------------------------------------------

  end_info read_end() {
    const uint64_t size = src_.size();
    if (size < kEndSize)
      corrupt("file has " + std::to_string(size) + " bytes, too few for an end of central directory record", 0);
    // Fast path: no comment, and the ZIP64 locator and record right before it (torch).
    uint64_t tail_len = std::min<uint64_t>(size, kEndSize + kZip64LocatorSize + kZip64EndSize);
    tail_offset_ = size - tail_len;
    tail_ = src_.read_vector(tail_offset_, size_t(tail_len));
    uint64_t eocd = size - kEndSize;
    const uint8_t* p = tail_.data() + (eocd - tail_offset_);
    if (!(load_u32(p) == kEndSig && load_u16(p + 20) == 0)) eocd = find_end_with_comment(size);
    return parse_end(eocd);
  }

  // The record with a comment: scan back from EOF; only a record whose comment ends exactly at
  // EOF counts, so trailing junk or a lying comment length is an error, not a guess. A comment
  // that itself holds the signature is refused: readers disagree on which record is real
  // (Python's zipfile takes the one in the comment).
  uint64_t find_end_with_comment(uint64_t size) {
    uint64_t len = std::min<uint64_t>(size, kEndSize + kMaxCommentSize);
    tail_offset_ = size - len;
    tail_ = src_.read_vector(tail_offset_, size_t(len));
    std::optional<uint64_t> mismatch;
    for (uint64_t i = len - kEndSize + 1; i-- > 0;) {
      const uint8_t* p = tail_.data() + i;
      if (load_u32(p) != kEndSig) continue;
      uint64_t comment = load_u16(p + 20);
      uint64_t rest = len - i - kEndSize;
      if (comment == rest) {
        for (uint64_t k = i + kEndSize; k + 4 <= len; ++k)
          if (load_u32(tail_.data() + k) == kEndSig)
            corrupt("archive comment contains an end of central directory signature", tail_offset_ + k);
        return tail_offset_ + i;
      }
      if (!mismatch) mismatch = tail_offset_ + i;
    }
    if (mismatch) {
      const uint8_t* p = tail_.data() + (*mismatch - tail_offset_);
      uint64_t comment = load_u16(p + 20);
      uint64_t rest = size - *mismatch - kEndSize;
      if (comment < rest)
        corrupt(std::to_string(rest - comment) + " bytes of trailing data after the end of central directory record", *mismatch);
      corrupt("end of central directory comment length " + std::to_string(comment) +
                  " runs past the end of the file (" + std::to_string(rest) + " bytes left)",
              *mismatch);
    }
    corrupt("no end of central directory record", size);
  }

  // Bytes [offset, offset+n): from the tail already read when possible.
  const uint8_t* bytes_at(uint64_t offset, size_t n) {
    if (offset >= tail_offset_ && offset + n <= tail_offset_ + tail_.size())
      return tail_.data() + (offset - tail_offset_);
    scratch_ = src_.read_vector(offset, n);
    return scratch_.data();
  }

  end_info parse_end(uint64_t eocd) {
    const uint8_t* p = bytes_at(eocd, kEndSize);
    uint16_t disk = load_u16(p + 4), cd_disk = load_u16(p + 6);
    uint16_t entries_disk = load_u16(p + 8), entries = load_u16(p + 10);
    uint32_t cd_size = load_u32(p + 12), cd_offset = load_u32(p + 16);

    end_info out;
    out.entries = entries;
    out.cd_size = cd_size;
    out.cd_offset = cd_offset;
    out.cd_end = eocd;

    bool zip64 = false;
    uint64_t locator = 0;
    if (eocd >= kZip64LocatorSize) {
      locator = eocd - kZip64LocatorSize;
      zip64 = load_u32(bytes_at(locator, kZip64LocatorSize)) == kZip64LocatorSig;
    }
    if (!zip64) {
      if (disk != 0 || cd_disk != 0) unsupported("multi-disk archive", eocd);
      if (entries_disk != entries)
        corrupt("end record counts " + std::to_string(entries_disk) + " entries on this disk but " +
                    std::to_string(entries) + " in total",
                eocd);
      return out;
    }

    const uint8_t* l = bytes_at(locator, kZip64LocatorSize);
    uint32_t z_disk = load_u32(l + 4);
    uint64_t z_offset = load_u64(l + 8);
    uint32_t disks = load_u32(l + 16);
    // miniz (torch.load's reader) takes only exactly one disk here: 0 is refused as
    // multi-disk too ("unsupported multidisk archive"), though zipfile ignores the field.
    if (z_disk != 0 || disks != 1)
      unsupported("multi-disk ZIP64 archive (its locator counts " + std::to_string(disks) +
                      " disks; torch.load reads only an archive of exactly 1)",
                  locator);
    if (z_offset > locator || locator - z_offset < kZip64EndSize)
      corrupt("ZIP64 locator points at offset " + std::to_string(z_offset) +
                  ", which leaves no room for the ZIP64 end record before it",
              locator);
    const uint8_t* z = bytes_at(z_offset, kZip64EndSize);
    if (load_u32(z) != kZip64EndSig)
      corrupt("no ZIP64 end of central directory record where the locator points", z_offset);
    uint64_t record_size = load_u64(z + 4);
    uint64_t record_end;
    if (record_size < kZip64EndSize - 12 || !checked_add(z_offset + 12, record_size, &record_end) ||
        record_end != locator)
      corrupt("ZIP64 end record size " + std::to_string(record_size) +
                  " does not end at the ZIP64 locator",
              z_offset);
    uint32_t z64_disk = load_u32(z + 16), z64_cd_disk = load_u32(z + 20);
    uint64_t z64_entries_disk = load_u64(z + 24), z64_entries = load_u64(z + 32);
    uint64_t z64_cd_size = load_u64(z + 40), z64_cd_offset = load_u64(z + 48);
    if (z64_disk != 0 || z64_cd_disk != 0) unsupported("multi-disk ZIP64 archive", z_offset);
    if ((disk != 0 && disk != kSentinel16) || (cd_disk != 0 && cd_disk != kSentinel16))
      unsupported("multi-disk archive", eocd);
    if (z64_entries_disk != z64_entries)
      corrupt("ZIP64 end record counts " + std::to_string(z64_entries_disk) +
                  " entries on this disk but " + std::to_string(z64_entries) + " in total",
              z_offset);
    // The 32-bit fields stand unless they hold the sentinel; when both exist they must agree.
    auto pick = [&](uint64_t narrow, uint64_t sentinel, uint64_t wide, const char* what) {
      if (narrow == sentinel) return wide;
      if (narrow != wide)
        corrupt(std::string("end record ") + what + " " + std::to_string(narrow) +
                    " disagrees with the ZIP64 end record's " + std::to_string(wide),
                eocd);
      return narrow;
    };
    pick(entries_disk, kSentinel16, z64_entries_disk, "entry count on this disk");
    out.entries = pick(entries, kSentinel16, z64_entries, "entry count");
    out.cd_size = pick(cd_size, kSentinel32, z64_cd_size, "central directory size");
    out.cd_offset = pick(cd_offset, kSentinel32, z64_cd_offset, "central directory offset");
    out.cd_end = z_offset;
    return out;
  }

  // --- central directory -------------------------------------------------------------------

  void read_central_directory(const end_info& end) {
    uint64_t cd_end = add(end.cd_offset, end.cd_size, "central directory end", end.cd_end);
    if (cd_end < end.cd_end)
      corrupt(std::to_string(end.cd_end - cd_end) +
                  " bytes between the central directory and the end record",
              cd_end);
    if (cd_end > end.cd_end)
      corrupt("central directory (" + std::to_string(end.cd_size) + " bytes at offset " +
                  std::to_string(end.cd_offset) + ") runs into the end record",
              end.cd_offset);
    if (end.entries == 0) corrupt("archive has no entries", end.cd_end);
    // Every entry takes at least 46 bytes: bound the count before reserving for it.
    if (end.entries > end.cd_size / kCentralHeaderSize)
      corrupt(std::to_string(end.entries) + " entries cannot fit in a central directory of " +
                  std::to_string(end.cd_size) + " bytes",
              end.cd_offset);

    std::vector<uint8_t> cd = src_.read_vector(end.cd_offset, size_t(end.cd_size));
    a_.entries_.reserve(size_t(end.entries));
    info_.reserve(size_t(end.entries));
    size_t pos = 0;
    size_t names_total = 0;
    for (uint64_t i = 0; i < end.entries; ++i) {
      uint64_t at = end.cd_offset + pos;
      if (cd.size() - pos < kCentralHeaderSize)
        corrupt("central directory ends inside entry " + std::to_string(i), at);
      const uint8_t* p = cd.data() + pos;
      if (load_u32(p) != kCentralSig)
        corrupt("no central directory header signature for entry " + std::to_string(i), at);
      uint16_t made_by = load_u16(p + 4);
      uint16_t flags = load_u16(p + 8);
      uint16_t method = load_u16(p + 10);
      uint32_t crc = load_u32(p + 16);
      uint32_t csize = load_u32(p + 20);
      uint32_t usize = load_u32(p + 24);
      size_t name_len = load_u16(p + 28);
      size_t extra_len = load_u16(p + 30);
      size_t comment_len = load_u16(p + 32);
      uint16_t disk = load_u16(p + 34);
      uint32_t external = load_u32(p + 38);
      uint32_t offset = load_u32(p + 42);
      size_t total = kCentralHeaderSize + name_len + extra_len + comment_len;
      if (cd.size() - pos < total)
        corrupt("central directory entry " + std::to_string(i) + " runs past the central directory", at);

      entry e;
      // A view into `cd` until the names move to their own buffer below.
      e.name = std::string_view(reinterpret_cast<const char*>(p + kCentralHeaderSize), name_len);
      check_encryption(e.name, flags, at);
      if (method != kMethodStored && method != kMethodDeflate)
        unsupported("entry " + quote(e.name) + " uses compression method " + std::to_string(method) +
                        " (" + method_name(method) + ")",
                    at);
      check_flags(e.name, flags, at);
      check_name(e.name, flags, at);
      check_attributes(e.name, made_by, external, at);
      extra_field z = find_zip64_extra(p + kCentralHeaderSize + name_len, extra_len, e.name, at);
      zip64_fields f = resolve_central_zip64(z, usize, csize, offset, disk, e.name, at);
      if (f.disk != 0) unsupported("entry " + quote(e.name) + " starts on disk " + std::to_string(f.disk), at);
      if (method == kMethodStored && f.csize != f.usize)
        corrupt("stored entry " + quote(e.name) + " has compressed size " + std::to_string(f.csize) +
                    " but uncompressed size " + std::to_string(f.usize),
                at);
      if (method == kMethodDeflate) {
        uint64_t most;
        if (!checked_mul(f.csize, kMaxDeflateRatio, &most) || !checked_add(most, kDeflateSlack, &most))
          most = std::numeric_limits<uint64_t>::max();
        if (f.usize > most)
          corrupt("entry " + quote(e.name) + " claims " + std::to_string(f.usize) + " bytes from " +
                      std::to_string(f.csize) + " compressed bytes, more than deflate can produce",
                  at);
      }
      e.method = method;
      e.flags = flags;
      e.crc32 = crc;
      e.compressed_size = f.csize;
      e.uncompressed_size = f.usize;
      e.local_header_offset = f.offset;
      a_.entries_.push_back(e);
      info_.push_back({at, name_len, pos + kCentralHeaderSize});
      names_total += name_len;
      pos += total;
    }
    if (pos != cd.size())
      corrupt(std::to_string(cd.size() - pos) + " unused bytes at the end of the central directory",
              end.cd_offset + pos);
    // The names, and nothing else of the central directory, stay: one block, no per-name heap.
    a_.names_.reset(new char[std::max<size_t>(names_total, 1)]);
    char* out = a_.names_.get();
    for (size_t i = 0; i < a_.entries_.size(); ++i) {
      std::memcpy(out, cd.data() + info_[i].name_pos, info_[i].name_len);
      a_.entries_[i].name = std::string_view(out, info_[i].name_len);
      out += info_[i].name_len;
    }
  }

  // --- names ---------------------------------------------------------------------------------

  // Case-folded names catch both exact duplicates and names that collide on case-insensitive
  // file systems or in case-insensitive tools (Z5). Checked before the layout, since
  // duplicates often share one local header and would otherwise read as an overlap.
  void check_duplicates() {
    const auto& entries = a_.entries_;
    // Names already in lower case (torch's all are) are their own folded form; only the
    // others need a folded copy, kept where the views stay valid.
    std::vector<std::string_view> folded(entries.size());
    std::deque<std::string> copies;
    auto index = std::make_unique<detail::string_index>(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      std::string_view key = entries[i].name;
      if (std::any_of(key.begin(), key.end(), [](char c) { return c >= 'A' && c <= 'Z'; })) {
        std::string& copy = copies.emplace_back(key);
        for (char& c : copy)
          if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
        key = copy;
      }
      folded[i] = key;
      const size_t earlier = index->insert(i, [&](size_t k) { return folded[k]; });
      if (earlier == detail::string_index::npos) continue;
      const std::string_view other = entries[earlier].name;
      const uint64_t at = info_[i].central_offset;
      if (other == entries[i].name) corrupt("duplicate entry name " + quote(other), at);
      corrupt("entry names " + quote(other) + " and " + quote(entries[i].name) +
                  " differ only in case",
              at);
    }
    // With every name its own folded form, this index is the one archive::find needs (by
    // full name): a million names are hashed and placed once, not twice.
    if (copies.empty()) a_.by_record_ = std::move(index);
  }

  // open_like: the names of an archive whose names were checked, one by one in its order.
  void check_same_names() {
    const auto& entries = a_.entries_;
    const auto& like = like_->entries_;
    if (entries.size() != like.size())
      corrupt("archive has " + std::to_string(entries.size()) + " entries, the archive it repeats " +
                  std::to_string(like.size()),
              info_.empty() ? 0 : info_[0].central_offset);
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].name != like[i].name)
        corrupt("entry " + std::to_string(i) + " is named " + quote(entries[i].name) + ", in the archive it repeats " +
                    quote(like[i].name),
                info_[i].central_offset);
  }

  void assign_prefix() {
    auto& entries = a_.entries_;
    const std::string_view first = entries[0].name;
    size_t slash = first.find('/');
    if (slash == std::string_view::npos)
      corrupt("first entry " + quote(first) + " is not inside a top-level folder",
              info_[0].central_offset);
    a_.prefix_ = std::string(first.substr(0, slash));
    const std::string lead = a_.prefix_ + "/";
    const bool index_here = !a_.by_record_ && !like_;
    if (index_here) a_.by_record_ = std::make_unique<detail::string_index>(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      entry& e = entries[i];
      if (e.name.substr(0, lead.size()) != lead)
        corrupt("entry " + quote(e.name) + " is outside the top-level folder " + quote(a_.prefix_),
                info_[i].central_offset);
      e.record = e.name.substr(lead.size());
      // Names are unique (check_duplicates).
      if (index_here) a_.by_record_->insert(i, [&](size_t k) { return entries[k].name; });
    }
  }

  // --- local headers ----------------------------------------------------------------------

  static uint64_t torch_extra_guess(const entry& e, size_t name_len) {
    uint64_t start = e.local_header_offset + kLocalHeaderSize + name_len + 4;
    if (e.uncompressed_size >= kSentinel32 || e.local_header_offset >= kSentinel32) {
      start += 4;
      if (e.uncompressed_size >= kSentinel32) start += 16;
      if (e.local_header_offset >= kSentinel32) start += 8;
    }
    uint64_t pad = (kTorchAlignment - start % kTorchAlignment) % kTorchAlignment;
    return start + pad - (e.local_header_offset + kLocalHeaderSize + name_len);
  }

  // Where one reader of local headers stands: buf holds file bytes from buf_offset (the
  // previous entry's descriptor, then the next local header, so a torch archive costs one
  // read per entry), and whether the headers so far had torch's padding, which sizes the
  // next read.
  struct header_cursor {
    std::vector<uint8_t> buf;
    uint64_t buf_offset = 0;
    bool torch_layout = true;
  };

  uint64_t header_guess(const header_cursor& cur, size_t i, uint64_t region_end) const {
    const entry& e = a_.entries_[i];
    uint64_t want = kLocalHeaderSize + info_[i].name_len + (cur.torch_layout ? torch_extra_guess(e, info_[i].name_len) : 0);
    return std::min(want, region_end - e.local_header_offset);
  }

  void read_local_headers(const end_info& end) {
    auto& entries = a_.entries_;
    const size_t n = entries.size();
    std::vector<size_t>& order = order_;
    order.resize(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    // Writers put the central directory in file order: then there is nothing to sort (ties,
    // which are errors, still go through the sort, so they are reported as before).
    bool in_file_order = true;
    for (size_t i = 1; i < n && in_file_order; ++i)
      in_file_order = entries[i - 1].local_header_offset < entries[i].local_header_offset;
    if (!in_file_order)
      std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        return entries[x].local_header_offset < entries[y].local_header_offset;
      });
    if (entries[order[0]].local_header_offset != 0)
      corrupt(std::to_string(entries[order[0]].local_header_offset) +
                  " bytes before the first local header",
              0);
    // Each entry owns [its local header, the next local header or the central directory).
    auto region_end_of = [&](size_t k) {
      return k + 1 < n ? entries[order[k + 1]].local_header_offset : end.cd_offset;
    };
    for (size_t k = 0; k < n; ++k) {
      const entry& e = entries[order[k]];
      if (region_end_of(k) > e.local_header_offset) continue;
      if (k + 1 < n)
        corrupt("entries " + quote(e.name) + " and " + quote(entries[order[k + 1]].name) +
                    " share local header offset " + std::to_string(e.local_header_offset),
                e.local_header_offset);
      corrupt("local header of " + quote(e.name) + " is not before the central directory",
              e.local_header_offset);
    }

    prefetch_local_headers(order);

    // Many small reads cost mostly system-call time, so big archives (20,000 records) split
    // them over a few threads, each over a run of neighbouring entries. The error reported
    // is the one a single pass would meet first: the earliest run's.
    const size_t runs = n >= kParallelHeaderEntries ? header_threads() : 1;
    std::vector<std::exception_ptr> failures(runs);
    auto scan = [&](size_t run) {
      try {
        const size_t from = n * run / runs, to = n * (run + 1) / runs;
        header_cursor cur;
        load_window(cur, entries[order[from]].local_header_offset, header_guess(cur, order[from], region_end_of(from)),
                    from + 1, to, region_end_of);
        for (size_t k = from; k < to; ++k) {
          const size_t i = order[k];
          const bool last = k + 1 == n;
          const uint64_t region_end = region_end_of(k);
          const uint64_t data_end = parse_local(cur, i, region_end, last);
          const uint64_t gap = region_end - data_end;
          check_gap(entries[i], gap, data_end);
          if (!last) {
            const uint64_t want = gap + header_guess(cur, order[k + 1], region_end_of(k + 1));
            if (!covers(cur, data_end, want)) load_window(cur, data_end, want, k + 2, to, region_end_of);
          }
          check_descriptor(entries[i], gap ? local_bytes(cur, data_end, size_t(gap)) : nullptr, size_t(gap), data_end);
          entries[i].end_offset = region_end;
        }
      } catch (...) {
        failures[run] = std::current_exception();
      }
    };
    std::vector<std::thread> helpers;
    size_t unstarted = runs;
    for (size_t run = 1; run < runs; ++run) {
      try {
        helpers.emplace_back(scan, run);
      } catch (const std::system_error&) {  // no thread to be had (ulimit -v, -u): do it here
        unstarted = run;
        break;
      }
    }
    scan(0);
    for (size_t run = unstarted; run < runs; ++run) scan(run);
    for (auto& t : helpers) t.join();
    for (auto& f : failures)
      if (f) std::rethrow_exception(f);
  }

  static size_t header_threads() {
    // Under an address-space limit (ulimit -v) each thread's stack and malloc arena
    // reservation count against it: a reader that fits with one thread must not fail
    // with several.
    struct rlimit as {};
    if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) return 1;
    unsigned hw = std::thread::hardware_concurrency();
    return std::clamp<size_t>(hw, 1, 4);
  }

  // Local headers lie scattered over the whole file, one per record. When they are not in
  // the page cache, reading them one after the other waits for the disk once per record
  // (293 times for a 2 GiB LLM checkpoint: most of what inspect costs); announcing them all
  // first lets the disk fetch them in parallel. One probe in the middle of the file decides,
  // since the hints cost time of their own when everything is cached already.
  void prefetch_local_headers(const std::vector<size_t>& order) {
    constexpr size_t kMinEntries = 4;
    constexpr uint64_t kDescriptorRoom = 24;  // the previous entry's descriptor, read along
    constexpr uint64_t kHeaderRoom = kLocalHeaderSize + 64 + 32;  // padding, ZIP64 field
    const auto& entries = a_.entries_;
    const size_t n = order.size();
    if (n < kMinEntries || src_.resident(entries[order[n / 2]].local_header_offset)) return;
    for (size_t k = 1; k < n; ++k) {
      const entry& e = entries[order[k]];
      const uint64_t from = e.local_header_offset - std::min(e.local_header_offset, kDescriptorRoom);
      src_.prefetch(from, size_t(kDescriptorRoom + kHeaderRoom + info_[order[k]].name_len));
    }
  }

  static bool covers(const header_cursor& cur, uint64_t offset, uint64_t n) {
    return offset >= cur.buf_offset && offset - cur.buf_offset <= cur.buf.size() &&
           n <= cur.buf.size() - (offset - cur.buf_offset);
  }

  // Reads [offset, offset+n) and, in the same read, the local headers of the entries from
  // order[next] on that end within kHeaderWindow of `offset`: an archive of a million tiny
  // records (one-element tensors) then costs a few hundred reads, not one per record, while
  // the records of big tensors are never read along.
  template <class RegionEnd>
  void load_window(header_cursor& cur, uint64_t offset, uint64_t n, size_t next, size_t to,
                   const RegionEnd& region_end_of) const {
    uint64_t end = offset + n;
    const auto& entries = a_.entries_;
    for (size_t j = next; j < to; ++j) {
      const size_t i = order_[j];
      const uint64_t header_end = entries[i].local_header_offset + header_guess(cur, i, region_end_of(j));
      if (header_end > offset + kHeaderWindow) break;
      end = std::max(end, header_end);
    }
    load_buf(cur, offset, end - offset);
  }

  void load_buf(header_cursor& cur, uint64_t offset, uint64_t n) const {
    cur.buf_offset = offset;
    cur.buf.resize(size_t(n));
    src_.read_exact(offset, cur.buf.data(), size_t(n));
  }

  // Makes sure the cursor's buffer covers [offset, offset+n), reading again if the guess
  // fell short.
  const uint8_t* local_bytes(header_cursor& cur, uint64_t offset, size_t n) const {
    if (offset >= cur.buf_offset && offset + n <= cur.buf_offset + cur.buf.size())
      return cur.buf.data() + (offset - cur.buf_offset);
    load_buf(cur, offset, n);
    return cur.buf.data();
  }

  // Validates entry i's local header against the central directory; returns where its data
  // ends. Nothing past the header is read.
  uint64_t parse_local(header_cursor& cur, size_t i, uint64_t region_end, bool last) {
    entry& e = a_.entries_[i];
    const uint64_t lho = e.local_header_offset;
    const char* next_thing = last ? "the central directory" : "the next entry";
    if (region_end - lho < kLocalHeaderSize)
      corrupt("local header of " + quote(e.name) + " is cut off by " + next_thing + " at offset " +
                  std::to_string(region_end),
              lho);
    const uint8_t* p = local_bytes(cur, lho, kLocalHeaderSize);
    if (load_u32(p) != kLocalSig) corrupt("no local header signature for " + quote(e.name), lho);
    const uint16_t flags = load_u16(p + 6);
    const uint16_t method = load_u16(p + 8);
    const uint32_t crc = load_u32(p + 14);
    const uint32_t csize = load_u32(p + 18);
    const uint32_t usize = load_u32(p + 22);
    const size_t name_len = load_u16(p + 26);
    const size_t extra_len = load_u16(p + 28);
    const uint64_t header_len = kLocalHeaderSize + name_len + extra_len;
    if (header_len > region_end - lho)
      corrupt("local header of " + quote(e.name) + " runs past " + next_thing + " at offset " +
                  std::to_string(region_end),
              lho);
    p = local_bytes(cur, lho, size_t(header_len));
    std::string_view local_name(reinterpret_cast<const char*>(p + kLocalHeaderSize), name_len);
    if (local_name != e.name)
      corrupt("local header name " + quote(local_name) + " differs from central directory name " +
                  quote(e.name),
              lho);
    if (flags != e.flags)
      corrupt("local header flags " + hex(flags) + " of " + quote(e.name) +
                  " differ from central directory flags " + hex(e.flags),
              lho);
    if (method != e.method)
      corrupt("local header method " + std::to_string(method) + " of " + quote(e.name) +
                  " differs from central directory method " + std::to_string(e.method),
              lho);
    if (cur.torch_layout && extra_len != torch_extra_guess(e, name_len)) cur.torch_layout = false;

    const extra_field z = find_zip64_extra(p + kLocalHeaderSize + name_len, extra_len, e.name, lho);
    const bool descriptor = e.flags & kFlagDescriptor;
    // With a data descriptor the local CRC and sizes are usually zero (miniz, Go); some writers
    // fill them in. Either way they may not contradict the central directory.
    auto agrees = [&](uint64_t local, uint64_t central) {
      return local == central || (descriptor && local == 0);
    };
    if (!agrees(crc, e.crc32))
      corrupt("local header CRC-32 " + hex(crc) + " of " + quote(e.name) +
                  " differs from central directory CRC-32 " + hex(e.crc32),
              lho);
    uint64_t local_csize = csize, local_usize = usize;
    bool sizes_known = true;
    if (usize == kSentinel32 || csize == kSentinel32) {
      // APPNOTE 4.5.3: a local ZIP64 field holds both sizes, uncompressed first.
      if (z.present && z.size >= 16) {
        if (usize == kSentinel32) local_usize = load_u64(z.data);
        if (csize == kSentinel32) local_csize = load_u64(z.data + 8);
      } else if (descriptor) {
        sizes_known = false;  // the descriptor carries the sizes
      } else {
        corrupt("local header of " + quote(e.name) + " has a ZIP64 sentinel but no ZIP64 sizes", lho);
      }
    }
    if (sizes_known &&
        (!agrees(local_csize, e.compressed_size) || !agrees(local_usize, e.uncompressed_size)))
      corrupt("local header sizes of " + quote(e.name) + " (" + std::to_string(local_csize) + "/" +
                  std::to_string(local_usize) + ") differ from the central directory's (" +
                  std::to_string(e.compressed_size) + "/" + std::to_string(e.uncompressed_size) + ")",
              lho);

    e.data_offset = lho + header_len;
    const uint64_t data_end = add(e.data_offset, e.compressed_size, "data end", lho);
    if (data_end > region_end)
      corrupt("data of " + quote(e.name) + " (" + std::to_string(e.compressed_size) +
                  " bytes at offset " + std::to_string(e.data_offset) + ") runs past " + next_thing +
                  " at offset " + std::to_string(region_end),
              e.data_offset);
    return data_end;
  }

  // Before reading the bytes between an entry's data and the next header: they must be
  // exactly a data descriptor (12, 16, 20 or 24 bytes) or nothing. Torch leaves no gaps.
  static void check_gap(const entry& e, uint64_t gap, uint64_t at) {
    if (!(e.flags & kFlagDescriptor)) {
      if (gap != 0)
        corrupt(std::to_string(gap) + " unaccounted bytes after the data of " + quote(e.name), at);
      return;
    }
    if (gap == 0) corrupt("data descriptor of " + quote(e.name) + " is missing", at);
    if (gap != 12 && gap != 16 && gap != 20 && gap != 24)
      corrupt(std::to_string(gap) + " bytes after the data of " + quote(e.name) +
                  " do not form a data descriptor",
              at);
  }

  // The gap length decides the form: 12/20 bytes without signature, 16/24 with it; 20/24
  // carry 64-bit sizes.
  static void check_descriptor(const entry& e, const uint8_t* d, size_t len, uint64_t at) {
    if (!(e.flags & kFlagDescriptor)) return;
    const bool has_sig = len == 16 || len == 24;
    if (has_sig && load_u32(d) != kDescriptorSig)
      corrupt("data descriptor of " + quote(e.name) + " has no signature", at);
    const uint8_t* q = d + (has_sig ? 4 : 0);
    const uint32_t crc = load_u32(q);
    uint64_t csize, usize;
    if (len <= 16) {
      csize = load_u32(q + 4);
      usize = load_u32(q + 8);
    } else {
      csize = load_u64(q + 4);
      usize = load_u64(q + 12);
    }
    if (crc != e.crc32 || csize != e.compressed_size || usize != e.uncompressed_size)
      corrupt("data descriptor of " + quote(e.name) + " (CRC-32 " + hex(crc) + ", sizes " +
                  std::to_string(csize) + "/" + std::to_string(usize) +
                  ") differs from the central directory (CRC-32 " + hex(e.crc32) + ", sizes " +
                  std::to_string(e.compressed_size) + "/" + std::to_string(e.uncompressed_size) + ")",
              at);
  }

  void check_totals() {
    uint64_t total = 0;
    for (const entry& e : a_.entries_) {
      if (e.method != kMethodDeflate) continue;
      if (!checked_add(total, e.uncompressed_size, &total) || total > a_.options_.max_inflated_total)
        throw_limit("zip: deflated entries declare more than " +
                        std::to_string(a_.options_.max_inflated_total) + " bytes in total",
                    e.local_header_offset);
    }
  }

  archive& a_;
  const byte_source& src_;
  const archive* like_;  // open_like's model, or null
  std::vector<central_extra> info_;
  std::vector<size_t> order_;  // entries by local header offset (read_local_headers)
  std::vector<uint8_t> tail_;
  uint64_t tail_offset_ = 0;
  std::vector<uint8_t> scratch_;
};

std::unique_ptr<archive> archive::open(const byte_source& src, const open_options& options) {
  std::unique_ptr<archive> a(new archive(src, options));
  try {
    archive_parser(*a, src).run();
  } catch (error& e) {
    src.locate(e);
    throw;
  }
  return a;
}

std::unique_ptr<archive> archive::open_like(const byte_source& src, const archive& like, const open_options& options) {
  std::unique_ptr<archive> a(new archive(src, options));
  try {
    archive_parser(*a, src, &like).run();
  } catch (error& e) {
    src.locate(e);
    throw;
  }
  return a;
}

archive::archive(const byte_source& src, open_options options) : src_(src), options_(options) {}
archive::~archive() = default;

const entry* archive::find(std::string_view record) const {
  if (!by_record_) {
    for (const entry& e : entries_)
      if (e.record == record) return &e;
    return nullptr;
  }
  // The index is by full name (see check_duplicates): "prefix/record", built on the stack
  // for the usual short names.
  char small[256];
  std::string big;
  const size_t n = prefix_.size() + 1 + record.size();
  char* name = small;
  if (n > sizeof small) {
    big.resize(n);
    name = big.data();
  }
  std::memcpy(name, prefix_.data(), prefix_.size());
  name[prefix_.size()] = '/';
  if (!record.empty()) std::memcpy(name + prefix_.size() + 1, record.data(), record.size());
  const size_t i = by_record_->find(std::string_view(name, n), [this](size_t k) { return entries_[k].name; });
  return i == detail::string_index::npos ? nullptr : &entries_[i];
}

std::vector<uint8_t> archive::read_record(const entry& e) const {
  try {
    if (e.uncompressed_size > options_.max_record_bytes)
      throw_limit("zip: entry " + quote(e.name) + " has " + std::to_string(e.uncompressed_size) +
                      " bytes, more than the limit of " + std::to_string(options_.max_record_bytes),
                  e.local_header_offset);
    if (e.method == kMethodStored) return src_.read_vector(e.data_offset, size_t(e.compressed_size));
    std::vector<uint8_t> out(size_t(e.uncompressed_size));
    inflate_entry(src_, e, out.data(), out.size(), true, [](const uint8_t*, size_t) {});
    return out;
  } catch (error& err) {
    src_.locate(err);
    throw;
  }
}

crc_result archive::record_crc(const entry& e, const std::function<void(uint64_t)>& progress) const {
  if (e.crc32 == 0 && e.uncompressed_size != 0) return {crc_outcome::not_recorded, 0};
  try {
    uint32_t crc = 0;
    std::vector<uint8_t> buf(size_t(std::min<uint64_t>(std::max<uint64_t>(e.uncompressed_size, 1), kIoChunk)));
    auto sink = [&](const uint8_t* p, size_t n) { crc = crc32_update(crc, p, n); };
    if (e.method == kMethodStored) {
      for (uint64_t done = 0; done < e.compressed_size;) {
        size_t n = size_t(std::min<uint64_t>(buf.size(), e.compressed_size - done));
        src_.read_exact(e.data_offset + done, buf.data(), n);
        sink(buf.data(), n);
        done += n;
        if (progress) progress(done);
      }
    } else {
      inflate_entry(src_, e, buf.data(), buf.size(), false, sink);
      if (progress) progress(e.compressed_size);
    }
    return {crc == e.crc32 ? crc_outcome::match : crc_outcome::mismatch, crc};
  } catch (error& err) {
    src_.locate(err);
    throw;
  }
}

void archive::verify_crc(const entry& e) const {
  const crc_result r = record_crc(e);
  if (r.outcome != crc_outcome::mismatch) return;
  try {
    corrupt("CRC-32 of " + quote(e.name) + " is " + hex(r.computed) + ", the central directory says " +
                hex(e.crc32),
            e.data_offset);
  } catch (error& err) {
    src_.locate(err);
    throw;
  }
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  constexpr size_t kStep = size_t(1) << 30;  // zlib takes uInt lengths
  while (n > 0) {
    size_t step = std::min(n, kStep);
    crc = uint32_t(::crc32(crc, p, uInt(step)));
    p += step;
    n -= step;
  }
  return crc;
}

}  // namespace ckpt::zip
