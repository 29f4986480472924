// ckpt::zip::writer: the layout PyTorchStreamWriter produces, read back by ckpt::zip::archive;
// misuse and I/O errors. Byte-identity with real torch.save output and loading by torch are
// in tests/py/test_zip_safetensors.py.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"
#include "base/byteio.h"
#include "ckpt/error.h"
#include "ckpt/zip_reader.h"
#include "ckpt/zip_writer.h"

using ckpt::errc;

namespace {

// A temporary file, removed when the test ends.
struct temp_file {
  std::string path;
  int fd = -1;
  temp_file() {
    char name[] = "/tmp/ckpt_zip_writer_XXXXXX";
    fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    path = name;
  }
  ~temp_file() {
    if (fd >= 0) ::close(fd);
    ::unlink(path.c_str());
  }
  std::vector<uint8_t> bytes() const {
    struct stat st;
    ::fstat(fd, &st);
    std::vector<uint8_t> out(size_t(st.st_size));
    if (!out.empty()) REQUIRE(::pread(fd, out.data(), out.size(), 0) == ssize_t(out.size()));
    return out;
  }
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 7);
  return v;
}

errc error_kind(const std::function<void()>& f) {
  try {
    f();
  } catch (const ckpt::error& e) {
    return e.kind();
  }
  FAIL("no ckpt::error thrown");
  return errc::check_failed;
}

// Counts read calls, to check that opening costs one read per local header.
class counting_source final : public ckpt::byte_source {
 public:
  explicit counting_source(std::vector<uint8_t> b) : bytes_(std::move(b)) {}
  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  mutable std::atomic<size_t> calls{0};  // read_exact may be called from several threads

 protected:
  void read_impl(uint64_t offset, void* dst, size_t n) const override {
    ++calls;
    std::memcpy(dst, bytes_.data() + offset, n);
  }

 private:
  std::vector<uint8_t> bytes_;
  std::string name_ = "<counting>";
};

}  // namespace

TEST_SUITE("zip_writer") {

TEST_CASE("padding follows PyTorch's getPadding") {
  using ckpt::zip::writer;
  // torch.save of a file named small.pt: "small/data.pkl" at 0 gets 16 bytes of 'Z'.
  CHECK(writer::padding_size(0, 14, 224, 64) == 16);
  // "small/.format_version" at 304: FB length 0x19 in the real file.
  CHECK(writer::padding_size(304, 21, 1, 64) == 25);
  // Offsets and sizes at 4 GiB add the ZIP64 field (4 + 16 and/or 8 bytes) to the start.
  CHECK(writer::padding_size(0, 10, 0xFFFFFFFFull, 64) ==
        (64 - (30 + 10 + 4 + 4 + 16) % 64) % 64);
  CHECK(writer::padding_size(0x100000000ull, 10, 5, 64) ==
        (64 - (0x100000000ull + 30 + 10 + 4 + 4 + 8) % 64) % 64);
  CHECK(writer::padding_size(0, 26, 8, 64) == 4);  // already aligned after 'FB'
  CHECK(writer::padding_size(0, 26 + 4, 8, 64) == 0);
}

TEST_CASE("round trip through the reader") {
  temp_file out;
  temp_file src;
  const auto big = pattern(300000, 3);
  REQUIRE(::pwrite(src.fd, big.data(), big.size(), 0) == ssize_t(big.size()));

  ckpt::zip::writer w(out.fd, "model");
  w.add_record("data.pkl", pattern(224, 1));
  w.add_record("empty", nullptr, 0);
  w.begin_record("data/0", 100000);
  for (int i = 0; i < 10; ++i) w.write(pattern(10000, 2).data(), 10000);
  w.end_record();
  w.add_record_copy("data/1", src.fd, 1000, 200000, std::nullopt);
  const uint32_t crc = ckpt::zip::crc32_update(0, big.data() + 5, 1234);
  w.add_record_copy("data/2", src.fd, 5, 1234, crc);
  w.add_record_copy("data/3", src.fd, 0, 0, 0u);
  w.add_record("version", std::vector<uint8_t>{'3', '\n'});
  w.finish();
  CHECK(w.offset() == out.bytes().size());

  ckpt::file_source in(out.path);
  auto a = ckpt::zip::archive::open(in);
  CHECK(a->prefix() == "model");
  REQUIRE(a->entries().size() == 7);
  std::vector<std::string> order;
  for (const auto& e : a->entries()) {
    order.emplace_back(e.record);
    CHECK(e.method == 0);
    CHECK(e.data_offset % 64 == 0);
    CHECK(e.flags == (e.uncompressed_size ? 0x0808 : 0x0800));
    a->verify_crc(e);
  }
  CHECK(order == std::vector<std::string>{"data.pkl", "empty", "data/0", "data/1", "data/2",
                                          "data/3", "version"});
  CHECK(a->read_record(*a->find("data.pkl")) == pattern(224, 1));
  CHECK(a->read_record(*a->find("empty")).empty());
  std::vector<uint8_t> expect0;
  for (int i = 0; i < 10; ++i) {
    auto p = pattern(10000, 2);
    expect0.insert(expect0.end(), p.begin(), p.end());
  }
  CHECK(a->read_record(*a->find("data/0")) == expect0);
  CHECK(a->read_record(*a->find("data/1")) ==
        std::vector<uint8_t>(big.begin() + 1000, big.begin() + 201000));
  CHECK(a->read_record(*a->find("data/2")) == std::vector<uint8_t>(big.begin() + 5, big.begin() + 1239));
  CHECK(a->find("data/3")->uncompressed_size == 0);
}

TEST_CASE("opening a written archive reads local headers in windows, never a large record's data") {
  // Tiny records (a million one-element tensors) come along with the headers around them, a
  // few reads in all where one read per record cost most of opening such an archive; the
  // data of a large record is never read.
  temp_file out;
  ckpt::zip::writer w(out.fd, "archive");
  uint64_t large_bytes = 0;
  for (int i = 0; i < 500; ++i) {
    auto p = pattern(i % 100 == 99 ? size_t(1) << 20 : size_t(i * 13 % 300), uint8_t(i));
    if (p.size() > (64 << 10)) large_bytes += p.size();
    w.add_record("data/" + std::to_string(i), p);
  }
  w.finish();
  const auto bytes = out.bytes();
  counting_source src(bytes);
  auto a = ckpt::zip::archive::open(src);
  CHECK(a->entries().size() == 500);
  CHECK(src.bytes_read() <= bytes.size() - large_bytes);
  CHECK(src.calls.load() <= 20);
}

TEST_CASE("ZIP64 end records and the 16-bit entry count") {
  temp_file out;
  ckpt::zip::writer w(out.fd, "many");
  for (int i = 0; i < 70000; ++i) w.add_record("data/" + std::to_string(i), {uint8_t(i), 1});
  w.finish();
  const auto bytes = out.bytes();
  const uint8_t* eocd = bytes.data() + bytes.size() - 22;
  CHECK(ckpt::load_u32(eocd) == 0x06054b50);
  CHECK(ckpt::load_u16(eocd + 10) == 0xFFFF);
  const uint8_t* z = bytes.data() + bytes.size() - 22 - 20 - 56;
  CHECK(ckpt::load_u32(z) == 0x06064b50);
  CHECK(ckpt::load_u64(z + 32) == 70000);
  ckpt::memory_source src(bytes);
  auto a = ckpt::zip::archive::open(src);
  CHECK(a->entries().size() == 70000);
  CHECK(a->read_record(*a->find("data/69999")) == std::vector<uint8_t>{uint8_t(69999), 1});
}

TEST_CASE("alignment is configurable") {
  temp_file out;
  ckpt::zip::writer w(out.fd, "a", 4096);
  w.add_record("x", pattern(10, 1));
  w.add_record("y", pattern(5000, 2));
  w.finish();
  ckpt::file_source in(out.path);
  auto a = ckpt::zip::archive::open(in);
  for (const auto& e : a->entries()) CHECK(e.data_offset % 4096 == 0);
}

TEST_CASE("a trusted CRC is written as given") {
  temp_file out, src;
  const auto data = pattern(1000, 9);
  REQUIRE(::pwrite(src.fd, data.data(), data.size(), 0) == 1000);
  ckpt::zip::writer w(out.fd, "a");
  w.add_record_copy("x", src.fd, 0, 1000, 0x12345678u);
  w.finish();
  ckpt::file_source in(out.path);
  auto a = ckpt::zip::archive::open(in);
  CHECK(a->entries()[0].crc32 == 0x12345678u);
  CHECK(error_kind([&] { a->verify_crc(a->entries()[0]); }) == errc::corrupt);
}

TEST_CASE("output to a pipe") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  temp_file src;
  const auto data = pattern(3000, 4);
  REQUIRE(::pwrite(src.fd, data.data(), data.size(), 0) == 3000);
  {
    ckpt::zip::writer w(p[1], "a");
    w.add_record("x", pattern(10, 1));
    // copy_file_range refuses pipes; the fallback copies through user space.
    w.add_record_copy("y", src.fd, 0, 3000, ckpt::zip::crc32_update(0, data.data(), 3000));
    w.finish();
  }
  ::close(p[1]);
  std::vector<uint8_t> got(1 << 16);
  size_t n = 0;
  for (ssize_t r; (r = ::read(p[0], got.data() + n, got.size() - n)) > 0;) n += size_t(r);
  ::close(p[0]);
  got.resize(n);
  ckpt::memory_source in(got);
  auto a = ckpt::zip::archive::open(in);
  CHECK(a->read_record(*a->find("y")) == data);
  a->verify_crc(*a->find("y"));
}

TEST_CASE("a record of unknown size below 4 GiB comes out as one of known size") {
  // rekey streams data.pkl in one pass: header, data, descriptor and central entry must be
  // the bytes a record declared with its size up front gets.
  for (size_t n : {size_t(1), size_t(5000), size_t(3 << 20)}) {
    const auto data = pattern(n, 9);
    temp_file known, unknown;
    for (int pass = 0; pass < 2; ++pass) {
      ckpt::zip::writer w(pass ? unknown.fd : known.fd, "m");
      w.add_record("first", pattern(77, 1));
      if (pass)
        w.begin_record_below_4gib("data.pkl");
      else
        w.begin_record("data.pkl", n);
      for (size_t at = 0; at < n; at += 4096) w.write(data.data() + at, std::min<size_t>(4096, n - at));
      w.end_record();
      CHECK(w.last_record_size() == n);
      CHECK(w.last_record_crc32() == ckpt::zip::crc32_update(0, data.data(), n));
      w.add_record("after", pattern(3, 2));
      w.finish();
    }
    CHECK(known.bytes() == unknown.bytes());
  }
  temp_file out;
  ckpt::zip::writer w(out.fd, "m");
  w.begin_record_below_4gib("empty");
  // Its header announced a descriptor, which an empty record must not have.
  CHECK(error_kind([&] { w.end_record(); }) == errc::usage);
  CHECK(error_kind([&] { w.finish(); }) == errc::io);
}

TEST_CASE("trusted unique names are not indexed, and come out the same") {
  temp_file checked, trusted;
  for (int pass = 0; pass < 2; ++pass) {
    ckpt::zip::writer w(pass ? trusted.fd : checked.fd, "m");
    if (pass) w.trust_unique_names();
    w.reserve(3);
    for (const char* name : {"data.pkl", "data/0", "version"}) w.add_record(name, pattern(10, 4));
    w.finish();
  }
  CHECK(checked.bytes() == trusted.bytes());
  temp_file out;
  ckpt::zip::writer w(out.fd, "m");
  w.add_record("a", pattern(1, 1));
  CHECK(error_kind([&] { w.add_record("a", pattern(1, 1)); }) == errc::usage);
}

TEST_CASE("misuse is a usage error") {
  temp_file out;
  CHECK(error_kind([&] { ckpt::zip::writer(out.fd, "a/b"); }) == errc::usage);
  CHECK(error_kind([&] { ckpt::zip::writer(out.fd, ""); }) == errc::usage);
  CHECK(error_kind([&] { ckpt::zip::writer(out.fd, ".."); }) == errc::usage);
  CHECK(error_kind([&] { ckpt::zip::writer(out.fd, "a", 0); }) == errc::usage);
  ckpt::zip::writer w(out.fd, "a");
  w.add_record("x", {1});
  CHECK(error_kind([&] { w.add_record("x", {2}); }) == errc::usage);
  CHECK(error_kind([&] { w.add_record("../x", {2}); }) == errc::usage);
  CHECK(error_kind([&] { w.add_record("x\\y", {2}); }) == errc::usage);
  CHECK(error_kind([&] { w.add_record("dir/", {2}); }) == errc::usage);
  CHECK(error_kind([&] { w.add_record("", {2}); }) == errc::usage);
  CHECK(error_kind([&] { w.write("a", 1); }) == errc::usage);
  CHECK(error_kind([&] { w.end_record(); }) == errc::usage);
  w.begin_record("s", 3);
  CHECK(error_kind([&] { w.write("abcd", 4); }) == errc::usage);
  CHECK(error_kind([&] { w.finish(); }) == errc::usage);
  CHECK(error_kind([&] { w.add_record("t", {1}); }) == errc::usage);
  w.write("ab", 2);
  CHECK(error_kind([&] { w.end_record(); }) == errc::usage);
  w.write("c", 1);
  w.end_record();
  w.finish();
  CHECK(error_kind([&] { w.add_record("u", {1}); }) == errc::usage);
  CHECK(error_kind([&] { w.finish(); }) == errc::usage);
  ckpt::file_source in(out.path);
  CHECK(ckpt::zip::archive::open(in)->entries().size() == 2);
}

TEST_CASE("write errors are io errors and stick") {
  temp_file f;
  const int ro = ::open(f.path.c_str(), O_RDONLY);
  REQUIRE(ro >= 0);
  {
    ckpt::zip::writer w(ro, "a");
    // Small records are buffered; a record over the buffer size is written at once.
    CHECK(error_kind([&] { w.add_record("x", std::vector<uint8_t>(2 << 20, 1)); }) == errc::io);
    CHECK(error_kind([&] { w.add_record("y", {1}); }) == errc::io);
    CHECK(error_kind([&] { w.finish(); }) == errc::io);
  }
  {
    ckpt::zip::writer w(ro, "a");
    w.add_record("x", {1});
    CHECK(error_kind([&] { w.finish(); }) == errc::io);
  }
  ::close(ro);
}

TEST_CASE("a short copy source is an io error") {
  temp_file out, src;
  REQUIRE(::pwrite(src.fd, "abc", 3, 0) == 3);
  ckpt::zip::writer w(out.fd, "a");
  CHECK(error_kind([&] { w.add_record_copy("x", src.fd, 0, 10, std::nullopt); }) == errc::io);
  ckpt::zip::writer w2(out.fd, "a");
  CHECK(error_kind([&] { w2.add_record_copy("x", src.fd, 0, 10, 0u); }) == errc::io);
}

}  // TEST_SUITE
