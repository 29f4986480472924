// PyTorchStreamWriter-compatible zip writer (layout in ckpt/zip_writer.h). Every constant
// and quirk below mirrors miniz as caffe2/serialize/inline_container.cc drives it, so a
// torch.save archive copied record by record comes out byte-identical.
#include "ckpt/zip_writer.h"

#include "ckpt/sys_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/byteio.h"
#include "ckpt/error.h"
#include "ckpt/zip_reader.h"
#include "zip/zip_format.h"
#include "zip/zip_names.h"

namespace ckpt::zip {
namespace {

using namespace format;


// miniz's finalize: "made by" Unix 3.0 and "needed" 4.5 in the ZIP64 end record only.
constexpr uint16_t kZip64MadeBy = 0x031E;
constexpr uint16_t kZip64Needed = 0x002D;

constexpr size_t kBufferSize = 1 << 20;
// Small enough that progress and early writeback (on_bytes_out) see steady steps, large
// enough that the system call count stays negligible.
constexpr size_t kCopyChunk = 16 << 20;

[[noreturn]] void usage_error(const std::string& msg) {
  throw error(errc::usage, "zip writer: " + msg);
}

bool needs_zip64(uint64_t size, uint64_t offset) { return size >= kSentinel32 || offset >= kSentinel32; }

// The ZIP64 extra field miniz writes: the sizes when the size is large, the offset when the
// offset is. `csize` is what goes in the compressed-size slot.
void append_zip64_extra(std::vector<uint8_t>& out, uint64_t size, uint64_t csize, uint64_t offset) {
  const bool big_size = size >= kSentinel32, big_offset = offset >= kSentinel32;
  if (!big_size && !big_offset) return;
  const uint16_t len = uint16_t((big_size ? 16 : 0) + (big_offset ? 8 : 0));
  uint8_t b[4 + 24];
  store_u16(b, kZip64ExtraId);
  store_u16(b + 2, len);
  uint8_t* p = b + 4;
  if (big_size) {
    store_u64(p, size);
    store_u64(p + 8, csize);
    p += 16;
  }
  if (big_offset) store_u64(p, offset);
  out.insert(out.end(), b, b + 4 + len);
}

}  // namespace

uint64_t writer::padding_size(uint64_t cursor, uint64_t name_size, uint64_t size,
                              uint64_t alignment) {
  uint64_t start = cursor + kLocalHeaderSize + name_size + 4;
  if (needs_zip64(size, cursor)) {
    start += 4;
    if (size >= kSentinel32) start += 16;
    if (cursor >= kSentinel32) start += 8;
  }
  return (alignment - start % alignment) % alignment;
}

writer::writer(int fd, std::string prefix, uint64_t alignment)
    : fd_(fd), prefix_(std::move(prefix)), alignment_(alignment) {
  if (alignment_ == 0 || alignment_ > kMaxAlignment)
    usage_error("alignment " + std::to_string(alignment_) + " is not in 1.." +
                std::to_string(kMaxAlignment));
  if (const char* why = name_problem(prefix_)) usage_error("prefix '" + prefix_ + "' " + why);
  if (prefix_.find('/') != std::string::npos) usage_error("prefix '" + prefix_ + "' contains '/'");
  if (!valid_utf8(prefix_)) usage_error("prefix is not valid UTF-8");
  buf_.reserve(kBufferSize);
}

void writer::check_writable() const {
  if (broken_) throw error(errc::io, "zip writer: an earlier write failed");
  if (finished_) usage_error("archive already finished");
}

void writer::add_record(std::string_view record, const void* data, size_t size) {
  begin_record(record, size);
  write(data, size);
  end_record();
}

void writer::begin_record(std::string_view record, uint64_t size) {
  check_writable();
  if (in_record_) usage_error("record '" + std::string(name_of(central_.back())) + "' is still open");
  start_entry(record, size);
}

void writer::begin_record_below_4gib(std::string_view record) {
  check_writable();
  if (in_record_) usage_error("record '" + std::string(name_of(central_.back())) + "' is still open");
  // Size 1 stands for any size in [1, 0xFFFFFFFE]: flags, ZIP64 field and padding only tell
  // 0 and >= 0xFFFFFFFF apart. The real size is set when the record ends.
  start_entry(record, 1);
  record_size_ = kSentinel32 - 1;
  record_unsized_ = true;
}

void writer::write(const void* data, size_t n) {
  check_writable();
  if (!in_record_) usage_error("write() outside a record");
  if (n > record_size_ - record_written_) {
    if (record_unsized_) broken_ = true;  // the header it has cannot describe that size
    usage_error("record '" + std::string(name_of(central_.back())) + "' declared " + std::to_string(record_size_) +
                " bytes; writing more");
  }
  record_crc_ = crc32_update(record_crc_, data, n);
  put(data, n);
  record_written_ += n;
}

void writer::end_record() {
  check_writable();
  if (!in_record_) usage_error("end_record() outside a record");
  if (record_unsized_) {
    record_unsized_ = false;
    if (record_written_ == 0) {
      broken_ = true;  // its header announced a descriptor that an empty record must not have
      usage_error("record '" + std::string(name_of(central_.back())) + "' begun with an unknown size got no bytes");
    }
    record_size_ = record_written_;
    central_.back().size = record_written_;
  }
  if (record_written_ != record_size_)
    usage_error("record '" + std::string(name_of(central_.back())) + "' declared " + std::to_string(record_size_) +
                " bytes but got " + std::to_string(record_written_));
  finish_entry(record_crc_);
}

void writer::add_record_known_crc(std::string_view record, const void* data, size_t size, uint32_t crc32) {
  begin_record(record, size);
  put(data, size);
  record_written_ = size;
  finish_entry(crc32);
}

void writer::reserve(size_t records) {
  central_.reserve(records);
  if (!trust_names_ && 2 * records > name_index_.size()) rebuild_name_index(2 * records);
}

// Slots hold 1 + the record's index and, above it, 32 bits of its name's hash, so a probe
// that meets another name rarely has to fetch that name to compare.
void writer::rebuild_name_index(size_t want) {
  size_t cap = 64;
  while (cap < want) cap *= 2;
  std::vector<uint64_t> fresh(cap, 0);
  fresh.swap(name_index_);
  const size_t mask = name_index_.size() - 1;
  for (size_t i = 0; i < central_.size(); ++i) {
    const uint64_t h = std::hash<std::string_view>()(name_of(central_[i]));
    size_t slot = h & mask;
    while (name_index_[slot]) slot = (slot + 1) & mask;
    name_index_[slot] = ((h >> 32) << 32) | uint64_t(i + 1);
  }
}

bool writer::insert_name(std::string_view name) {
  if (trust_names_) {
    if (central_.size() >= UINT32_MAX - 1) usage_error("more than 4294967294 records");
    names_.append(name);
    return true;
  }
  // Kept at most half full; rebuilt from the arena when it grows.
  if (2 * (central_.size() + 1) > name_index_.size()) rebuild_name_index(2 * name_index_.size());
  if (central_.size() >= UINT32_MAX - 1) usage_error("more than 4294967294 records");
  const size_t mask = name_index_.size() - 1;
  const uint64_t h = std::hash<std::string_view>()(name);
  size_t slot = h & mask;
  for (; name_index_[slot]; slot = (slot + 1) & mask)
    if ((name_index_[slot] >> 32) == (h >> 32) && name_of(central_[(name_index_[slot] & 0xFFFFFFFFu) - 1]) == name)
      return false;
  // The record about to be pushed is central_.size().
  name_index_[slot] = ((h >> 32) << 32) | uint64_t(central_.size() + 1);
  names_.append(name);
  return true;
}

const uint8_t* source_window::bytes(uint64_t offset, size_t n) {
  if (offset >= start_ && n <= buf_.size() && offset - start_ <= buf_.size() - n) return buf_.data() + (offset - start_);
  buf_.resize(std::max(window_, n));
  size_t got = 0;
  while (got < buf_.size()) {
    const ssize_t r = ::pread(fd_, buf_.data() + got, buf_.size() - got, off_t(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      buf_.clear();
      throw error(errc::io, std::string("reading the source failed: ") + std::strerror(err), offset + got);
    }
    if (r == 0) break;
    got += size_t(r);
  }
  buf_.resize(got);
  start_ = offset;
  if (got < n) throw error(errc::io, "the source ended " + std::to_string(n - got) + " bytes short", offset + got);
  return buf_.data();
}

void writer::add_record_copy(std::string_view record, int src_fd, uint64_t src_offset,
                             uint64_t size, std::optional<uint32_t> known_crc32) {
  begin_record(record, size);
  uint64_t left = size;
  if (known_crc32 && left > 0) {
    flush();
    copy_range_in_kernel(src_fd, src_offset, left);
  }
  std::vector<uint8_t> chunk(size_t(std::min<uint64_t>(std::max<uint64_t>(left, 1), kBufferSize)));
  while (left > 0) {
    const size_t want = size_t(std::min<uint64_t>(chunk.size(), left));
    const ssize_t got = ::pread(src_fd, chunk.data(), want, off_t(src_offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_io("reading the source at offset " + std::to_string(src_offset), errno);
    }
    if (got == 0) {
      broken_ = true;
      throw error(errc::io, "zip writer: source ended " + std::to_string(left) +
                                " bytes short of record '" + std::string(record) + "'",
                  src_offset);
    }
    if (!known_crc32) record_crc_ = crc32_update(record_crc_, chunk.data(), size_t(got));
    put(chunk.data(), size_t(got));
    src_offset += uint64_t(got);
    left -= uint64_t(got);
  }
  record_written_ = size;
  finish_entry(known_crc32 ? *known_crc32 : record_crc_);
}

// Leaves `left` == 0 when the kernel copied everything; otherwise the caller finishes
// with pread/write from the advanced `src_offset` (the kernel may refuse at any point:
// cross-device on old kernels, special files, unsupported file systems).
void writer::copy_range_in_kernel(int src_fd, uint64_t& src_offset, uint64_t& left) {
  while (left > 0) {
    off_t in = off_t(src_offset);
    const ssize_t n =
        sys::copy_file_range(src_fd, &in, fd_, nullptr, size_t(std::min<uint64_t>(left, kCopyChunk)));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
          errno == EBADF || errno == ETXTBSY || errno == EPERM)
        return;
      fail_io("copy_file_range", errno);
    }
    if (n == 0) return;  // the fallback tells a short source from a kernel quirk
    src_offset += uint64_t(n);
    left -= uint64_t(n);
    cursor_ += uint64_t(n);
    report_bytes_out();
  }
}

void writer::start_entry(std::string_view record, uint64_t size) {
  if (const char* why = name_problem(record))
    usage_error("record name '" + std::string(record) + "' " + why);
  if (!valid_utf8(record)) usage_error("record name is not valid UTF-8");
  std::string& name = entry_name_;
  name.assign(prefix_).append(1, '/').append(record);
  if (name.size() > kSentinel16) usage_error("record name longer than 65535 bytes");
  // Torch refuses a second record of the same name ("Tried to serialize file twice").
  if (!insert_name(name)) usage_error("record '" + name + "' written twice");

  const uint64_t offset = cursor_;
  const uint16_t flags = uint16_t(size > 0 ? (kFlagDescriptor | kFlagUtf8) : kFlagUtf8);
  const uint64_t pad = padding_size(offset, name.size(), size, alignment_);

  std::vector<uint8_t>& extra = entry_extra_;
  extra.clear();
  append_zip64_extra(extra, size, 0, offset);
  const uint8_t fb[4] = {'F', 'B', uint8_t(pad), uint8_t(pad >> 8)};
  extra.insert(extra.end(), fb, fb + 4);
  extra.insert(extra.end(), size_t(pad), uint8_t('Z'));

  uint8_t h[kLocalHeaderSize] = {};
  store_u32(h, kLocalSig);
  store_u16(h + 6, flags);
  store_u16(h + 26, uint16_t(name.size()));
  store_u16(h + 28, uint16_t(extra.size()));
  put(h, sizeof h);
  put(name.data(), name.size());
  put(extra.data(), extra.size());

  central_.push_back({uint64_t(names_.size() - name.size()), size, offset, uint32_t(name.size()), 0, flags});
  in_record_ = true;
  record_size_ = size;
  record_written_ = 0;
  record_crc_ = 0;
}

void writer::finish_entry(uint32_t crc) {
  central_record& c = central_.back();
  c.crc32 = crc;
  if (c.flags & kFlagDescriptor) {
    uint8_t d[24];
    store_u32(d, kDescriptorSig);
    store_u32(d + 4, crc);
    size_t len = 16;
    if (needs_zip64(c.size, c.local_header_offset)) {
      store_u64(d + 8, c.size);
      store_u64(d + 16, c.size);
      len = 24;
    } else {
      store_u32(d + 8, uint32_t(c.size));
      store_u32(d + 12, uint32_t(c.size));
    }
    put(d, len);
  }
  in_record_ = false;
}

void writer::finish() {
  check_writable();
  if (in_record_) usage_error("record '" + std::string(name_of(central_.back())) + "' is still open");
  const uint64_t cd_offset = cursor_;
  std::vector<uint8_t> extra;
  for (const central_record& c : central_) {
    extra.clear();
    append_zip64_extra(extra, c.size, c.size, c.local_header_offset);
    uint8_t h[kCentralHeaderSize] = {};
    store_u32(h, kCentralSig);
    store_u16(h + 8, c.flags);
    store_u32(h + 16, c.crc32);
    store_u32(h + 20, uint32_t(std::min<uint64_t>(c.size, kSentinel32)));
    store_u32(h + 24, uint32_t(std::min<uint64_t>(c.size, kSentinel32)));
    const std::string_view name = name_of(c);
    store_u16(h + 28, uint16_t(name.size()));
    store_u16(h + 30, uint16_t(extra.size()));
    store_u32(h + 42, uint32_t(std::min<uint64_t>(c.local_header_offset, kSentinel32)));
    put(h, sizeof h);
    put(name.data(), name.size());
    put(extra.data(), extra.size());
  }
  const uint64_t cd_size = cursor_ - cd_offset;
  const uint64_t count = central_.size();

  const uint64_t zip64_end = cursor_;
  uint8_t z[kZip64EndSize] = {};
  store_u32(z, kZip64EndSig);
  store_u64(z + 4, kZip64EndSize - 12);
  store_u16(z + 12, kZip64MadeBy);
  store_u16(z + 14, kZip64Needed);
  store_u64(z + 24, count);
  store_u64(z + 32, count);
  store_u64(z + 40, cd_size);
  store_u64(z + 48, cd_offset);
  put(z, sizeof z);

  uint8_t l[kZip64LocatorSize] = {};
  store_u32(l, kZip64LocatorSig);
  store_u64(l + 8, zip64_end);
  store_u32(l + 16, 1);
  put(l, sizeof l);

  uint8_t e[kEndSize] = {};
  store_u32(e, kEndSig);
  store_u16(e + 8, uint16_t(std::min<uint64_t>(count, kSentinel16)));
  store_u16(e + 10, uint16_t(std::min<uint64_t>(count, kSentinel16)));
  store_u32(e + 12, uint32_t(std::min<uint64_t>(cd_size, kSentinel32)));
  store_u32(e + 16, uint32_t(std::min<uint64_t>(cd_offset, kSentinel32)));
  put(e, sizeof e);

  flush();
  finished_ = true;
}

void writer::put(const void* data, size_t n) {
  if (n == 0) return;
  if (buf_.size() + n > kBufferSize) flush();
  if (n >= kBufferSize) {
    write_fully(data, n);
    cursor_ += n;
    report_bytes_out();
    return;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  buf_.insert(buf_.end(), p, p + n);
  cursor_ += n;
}

void writer::flush() {
  if (buf_.empty()) return;
  write_fully(buf_.data(), buf_.size());
  buf_.clear();
  report_bytes_out();
}

void writer::write_fully(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = sys::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_io("write failed", errno);
    }
    if (w == 0) fail_io("write made no progress", EIO);
    p += w;
    n -= size_t(w);
  }
}

void writer::fail_io(const std::string& what, int err) {
  broken_ = true;
  throw error(errc::io, "zip writer: " + what + ": " + std::strerror(err), cursor_);
}

}  // namespace ckpt::zip
