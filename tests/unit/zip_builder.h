// Builds zip archives in memory for the zip reader and writer tests, independently of
// ckpt::zip::writer, and records where each structure landed so a test can break exactly
// one field. The defaults mirror torch.save (descriptors with signature, ZIP64 end records);
// options produce what other writers do (no descriptor, classic end record only, comments,
// junk before, between and after).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/byteio.h"
#include "ckpt/zip_reader.h"

namespace zip_test {

struct member {
  std::string name;
  std::vector<uint8_t> content;  // uncompressed bytes
  uint16_t method = 0;           // 8: content is raw-deflated by the builder
  bool descriptor = true;        // flag bit 3 + data descriptor after the data
  bool descriptor_sig = true;    // "PK\7\8" in front of the descriptor
  bool descriptor64 = false;     // 64-bit sizes in the descriptor
  uint16_t extra_flags = 0;      // OR'd into the flags of both headers
  uint16_t made_by = 0;
  uint32_t external = 0;
  bool zip64_central = false;    // central entry: sentinels + ZIP64 extra (usize, csize, offset)
  bool zip64_local = false;      // local header: size sentinels + ZIP64 extra (usize, csize)
  std::vector<uint8_t> local_extra;  // raw bytes appended to the local extra field
  std::vector<uint8_t> gap_after;    // junk between this entry and the next structure
};

struct options {
  bool zip64_end = true;
  std::vector<uint8_t> lead;      // junk before the first local header (offsets account for it)
  std::string comment;
  std::vector<uint8_t> trailing;  // junk after the end record
};

struct layout {
  std::vector<uint64_t> local, data, descriptor, central;
  uint64_t cd_offset = 0, cd_size = 0, zip64_end = 0, locator = 0, eocd = 0;
};

struct built {
  std::vector<uint8_t> bytes;
  layout at;
};

inline std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

inline std::vector<uint8_t> raw_deflate(const std::vector<uint8_t>& in) {
  z_stream zs{};
  deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  std::vector<uint8_t> out(deflateBound(&zs, uLong(in.size())) + 16);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = uInt(in.size());
  zs.next_out = out.data();
  zs.avail_out = uInt(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

inline void put16(std::vector<uint8_t>& v, uint16_t x) {
  uint8_t b[2];
  ckpt::store_u16(b, x);
  v.insert(v.end(), b, b + 2);
}
inline void put32(std::vector<uint8_t>& v, uint32_t x) {
  uint8_t b[4];
  ckpt::store_u32(b, x);
  v.insert(v.end(), b, b + 4);
}
inline void put64(std::vector<uint8_t>& v, uint64_t x) {
  uint8_t b[8];
  ckpt::store_u64(b, x);
  v.insert(v.end(), b, b + 8);
}
inline void patch16(std::vector<uint8_t>& v, uint64_t at, uint16_t x) { ckpt::store_u16(v.data() + at, x); }
inline void patch32(std::vector<uint8_t>& v, uint64_t at, uint32_t x) { ckpt::store_u32(v.data() + at, x); }
inline void patch64(std::vector<uint8_t>& v, uint64_t at, uint64_t x) { ckpt::store_u64(v.data() + at, x); }

inline built build(const std::vector<member>& members, const options& opt = {}) {
  built b;
  std::vector<uint8_t>& out = b.bytes;
  out = opt.lead;
  struct done {
    uint32_t crc;
    uint64_t csize, usize, offset;
    uint16_t flags;
  };
  std::vector<done> info;
  for (const member& m : members) {
    const std::vector<uint8_t> stored = m.method == 8 ? raw_deflate(m.content) : m.content;
    const uint32_t crc = ckpt::zip::crc32_update(0, m.content.data(), m.content.size());
    const uint16_t flags = uint16_t(0x0800 | (m.descriptor ? 0x0008 : 0) | m.extra_flags);
    const uint64_t offset = out.size();
    b.at.local.push_back(offset);
    std::vector<uint8_t> extra;
    if (m.zip64_local) {
      put16(extra, 1);
      put16(extra, 16);
      put64(extra, m.content.size());
      put64(extra, stored.size());
    }
    extra.insert(extra.end(), m.local_extra.begin(), m.local_extra.end());
    put32(out, 0x04034b50);
    put16(out, 20);
    put16(out, flags);
    put16(out, m.method);
    put32(out, 0);  // time, date
    if (m.descriptor && !m.zip64_local) {
      put32(out, 0);
      put32(out, 0);
      put32(out, 0);
    } else {
      put32(out, m.descriptor ? 0 : crc);
      put32(out, m.zip64_local ? 0xFFFFFFFF : uint32_t(stored.size()));
      put32(out, m.zip64_local ? 0xFFFFFFFF : uint32_t(m.content.size()));
    }
    put16(out, uint16_t(m.name.size()));
    put16(out, uint16_t(extra.size()));
    out.insert(out.end(), m.name.begin(), m.name.end());
    out.insert(out.end(), extra.begin(), extra.end());
    b.at.data.push_back(out.size());
    out.insert(out.end(), stored.begin(), stored.end());
    b.at.descriptor.push_back(out.size());
    if (m.descriptor) {
      if (m.descriptor_sig) put32(out, 0x08074b50);
      put32(out, crc);
      if (m.descriptor64) {
        put64(out, stored.size());
        put64(out, m.content.size());
      } else {
        put32(out, uint32_t(stored.size()));
        put32(out, uint32_t(m.content.size()));
      }
    }
    out.insert(out.end(), m.gap_after.begin(), m.gap_after.end());
    info.push_back({crc, stored.size(), m.content.size(), offset, flags});
  }
  b.at.cd_offset = out.size();
  for (size_t i = 0; i < members.size(); ++i) {
    const member& m = members[i];
    const done& d = info[i];
    b.at.central.push_back(out.size());
    std::vector<uint8_t> extra;
    if (m.zip64_central) {
      put16(extra, 1);
      put16(extra, 24);
      put64(extra, d.usize);
      put64(extra, d.csize);
      put64(extra, d.offset);
    }
    put32(out, 0x02014b50);
    put16(out, m.made_by);
    put16(out, 20);
    put16(out, d.flags);
    put16(out, m.method);
    put32(out, 0);
    put32(out, d.crc);
    put32(out, m.zip64_central ? 0xFFFFFFFF : uint32_t(d.csize));
    put32(out, m.zip64_central ? 0xFFFFFFFF : uint32_t(d.usize));
    put16(out, uint16_t(m.name.size()));
    put16(out, uint16_t(extra.size()));
    put16(out, 0);  // comment
    put16(out, 0);  // disk
    put16(out, 0);  // internal attributes
    put32(out, m.external);
    put32(out, m.zip64_central ? 0xFFFFFFFF : uint32_t(d.offset));
    out.insert(out.end(), m.name.begin(), m.name.end());
    out.insert(out.end(), extra.begin(), extra.end());
  }
  b.at.cd_size = out.size() - b.at.cd_offset;
  const uint64_t n = members.size();
  if (opt.zip64_end) {
    b.at.zip64_end = out.size();
    put32(out, 0x06064b50);
    put64(out, 44);
    put16(out, 0x031E);
    put16(out, 0x002D);
    put32(out, 0);
    put32(out, 0);
    put64(out, n);
    put64(out, n);
    put64(out, b.at.cd_size);
    put64(out, b.at.cd_offset);
    b.at.locator = out.size();
    put32(out, 0x07064b50);
    put32(out, 0);
    put64(out, b.at.zip64_end);
    put32(out, 1);
  }
  b.at.eocd = out.size();
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, uint16_t(n));
  put16(out, uint16_t(n));
  put32(out, uint32_t(b.at.cd_size));
  put32(out, uint32_t(b.at.cd_offset));
  put16(out, uint16_t(opt.comment.size()));
  out.insert(out.end(), opt.comment.begin(), opt.comment.end());
  out.insert(out.end(), opt.trailing.begin(), opt.trailing.end());
  return b;
}

// A small torch-like archive: three stored records under "arch/".
inline std::vector<member> torch_like() {
  return {{"arch/data.pkl", bytes_of("\x80\x02}q\x01.")},
          {"arch/data/0", std::vector<uint8_t>(40, 7)},
          {"arch/version", bytes_of("3\n")}};
}

}  // namespace zip_test
