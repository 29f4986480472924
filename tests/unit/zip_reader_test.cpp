// ckpt::zip::archive against hand-built archives: one case per hazard class of
// security.md §2.B (Z3-Z10), each with the expected error kind, next to a success twin that
// differs only in the broken field.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/zip_reader.h"
#include "zip_builder.h"

using namespace zip_test;
using ckpt::errc;

namespace {

struct outcome {
  bool ok = false;
  errc kind = errc::corrupt;
  std::string message;
  std::optional<uint64_t> offset;
};

outcome try_open(const std::vector<uint8_t>& bytes, const ckpt::zip::open_options& opt = {}) {
  ckpt::memory_source src(bytes);
  outcome o;
  try {
    ckpt::zip::archive::open(src, opt);
    o.ok = true;
  } catch (const ckpt::error& e) {
    o.kind = e.kind();
    o.message = e.message();
    o.offset = e.offset();
  }
  return o;
}

void expect_ok(const std::vector<uint8_t>& bytes) {
  outcome o = try_open(bytes);
  CHECK_MESSAGE(o.ok, o.message);
}

void expect_error(const std::vector<uint8_t>& bytes, errc kind, const std::string& needle,
                  std::optional<uint64_t> offset = std::nullopt) {
  outcome o = try_open(bytes);
  REQUIRE_FALSE(o.ok);
  CHECK_MESSAGE(o.kind == kind, o.message);
  CHECK_MESSAGE(o.message.find(needle) != std::string::npos, o.message);
  if (offset) CHECK(o.offset == offset);
}

}  // namespace

TEST_SUITE("zip_reader") {

TEST_CASE("torch-like archive: entries, prefix, offsets, contents") {
  built b = build(torch_like());
  ckpt::memory_source src(b.bytes);
  auto a = ckpt::zip::archive::open(src);
  CHECK(a->prefix() == "arch");
  REQUIRE(a->entries().size() == 3);
  const auto* e = a->find("data/0");
  REQUIRE(e != nullptr);
  CHECK(e->name == "arch/data/0");
  CHECK(e->record == "data/0");
  CHECK(e->method == 0);
  CHECK(e->flags == 0x0808);
  CHECK(e->local_header_offset == b.at.local[1]);
  CHECK(e->data_offset == b.at.data[1]);
  CHECK(e->end_offset == b.at.local[2]);
  CHECK(a->read_record(*e) == std::vector<uint8_t>(40, 7));
  a->verify_crc(*e);
  CHECK(a->find("missing") == nullptr);
  CHECK(a->find("arch/data/0") == nullptr);
  CHECK(a->entries().back().end_offset == b.at.cd_offset);
}

// find() looks records up by full name ("prefix/record"), in the index check_duplicates made
// when every name is its own case-folded form, else in one of its own.
TEST_CASE("find by record: lower- and upper-case prefixes, long names, views into the archive") {
  for (std::string prefix : {"arch", "MyModel"}) {
    CAPTURE(prefix);
    const std::string long_record = "data/" + std::string(300, 'x');
    std::vector<member> ms = {{prefix + "/data.pkl", {1, 2, 3}}, {prefix + "/data/0", std::vector<uint8_t>(8, 7)},
                              {prefix + "/" + long_record, {5}}, {prefix + "/Data/1", {6}}};
    built b = build(ms);
    ckpt::memory_source src(b.bytes);
    auto a = ckpt::zip::archive::open(src);
    CHECK(a->prefix() == prefix);
    for (const auto& e : a->entries()) {
      REQUIRE(a->find(e.record) == &e);
      CHECK(e.name == prefix + "/" + std::string(e.record));
    }
    CHECK(a->find(long_record)->uncompressed_size == 1);
    CHECK(a->find("data/1") == nullptr);  // names are case-sensitive for find
    CHECK(a->find("Data/1") != nullptr);
    CHECK(a->find("") == nullptr);
    CHECK(a->find(prefix + "/data/0") == nullptr);
    CHECK(a->find(std::string(400, 'y')) == nullptr);
  }
}

TEST_CASE("other writers' layouts open") {
  SUBCASE("no data descriptors, classic end record only (Python zipfile)") {
    auto m = torch_like();
    for (auto& x : m) x.descriptor = false;
    options o;
    o.zip64_end = false;
    expect_ok(build(m, o).bytes);
  }
  SUBCASE("descriptor without signature (12 bytes)") {
    auto m = torch_like();
    m[1].descriptor_sig = false;
    expect_ok(build(m).bytes);
  }
  SUBCASE("64-bit descriptors, with and without signature") {
    auto m = torch_like();
    m[0].descriptor64 = true;
    m[1].descriptor64 = true;
    m[1].descriptor_sig = false;
    expect_ok(build(m).bytes);
  }
  SUBCASE("ZIP64 fields in central and local headers") {
    auto m = torch_like();
    m[1].zip64_central = true;
    m[2].zip64_local = true;
    m[2].descriptor = false;
    built b = build(m);
    ckpt::memory_source src(b.bytes);
    auto a = ckpt::zip::archive::open(src);
    CHECK(a->find("data/0")->uncompressed_size == 40);
    CHECK(a->find("data/0")->local_header_offset == b.at.local[1]);
    CHECK(a->read_record(*a->find("version")) == bytes_of("3\n"));
  }
  SUBCASE("a comment that ends exactly at EOF") {
    options o;
    o.comment = "made by a test";
    expect_ok(build(torch_like(), o).bytes);
  }
  SUBCASE("an unrelated extra field in the local header") {
    auto m = torch_like();
    m[0].local_extra = {0x55, 0x54, 0x05, 0x00, 1, 2, 3, 4, 5};
    expect_ok(build(m).bytes);
  }
}

TEST_CASE("deflated records inflate exactly") {
  std::vector<uint8_t> text;
  for (int i = 0; i < 5000; ++i) text.push_back(uint8_t("def forward(self):\n"[i % 19]));
  auto m = torch_like();
  m.push_back({"arch/code/__torch__.py", text, 8});
  built b = build(m);
  ckpt::memory_source src(b.bytes);
  auto a = ckpt::zip::archive::open(src);
  const auto* e = a->find("code/__torch__.py");
  REQUIRE(e != nullptr);
  CHECK(e->method == 8);
  CHECK(e->compressed_size < e->uncompressed_size);
  CHECK(a->read_record(*e) == text);
  a->verify_crc(*e);

  SUBCASE("empty deflated record") {
    auto m2 = torch_like();
    m2.push_back({"arch/empty", {}, 8});
    built b2 = build(m2);
    ckpt::memory_source src2(b2.bytes);
    auto a2 = ckpt::zip::archive::open(src2);
    CHECK(a2->read_record(*a2->find("empty")).empty());
  }
  SUBCASE("invalid deflate data") {
    auto bytes = b.bytes;
    bytes[e->data_offset] = 0xFF;  // block type 3 does not exist
    ckpt::memory_source bad(bytes);
    auto a2 = ckpt::zip::archive::open(bad);
    CHECK_THROWS_AS(a2->read_record(*a2->find("code/__torch__.py")), ckpt::error);
    try {
      a2->read_record(*a2->find("code/__torch__.py"));
    } catch (const ckpt::error& err) {
      CHECK(err.kind() == errc::corrupt);
      CHECK(err.offset() == e->data_offset);
    }
  }
}

TEST_CASE("long archives: every local header checked, the first problem in file order reported") {
  std::vector<member> m;
  for (int i = 0; i < 5000; ++i) m.push_back({"arch/data/" + std::to_string(i), std::vector<uint8_t>(3, uint8_t(i))});
  built b = build(m);
  {
    ckpt::memory_source src(b.bytes);
    auto a = ckpt::zip::archive::open(src);
    bool offsets_ok = a->entries().size() == m.size();
    for (size_t i = 0; offsets_ok && i < m.size(); ++i)
      offsets_ok = a->entries()[i].data_offset == b.at.data[i] && a->entries()[i].end_offset ==
                   (i + 1 < m.size() ? b.at.local[i + 1] : b.at.cd_offset);
    CHECK(offsets_ok);
  }
  auto broken = b.bytes;
  broken[b.at.local[3750] + 8] = 9;  // the method
  expect_error(broken, errc::corrupt, "'arch/data/3750'", b.at.local[3750]);
  broken[b.at.local[1250] + 8] = 9;  // an earlier problem wins
  expect_error(broken, errc::corrupt, "'arch/data/1250'", b.at.local[1250]);
  // Archives this long are read by several threads, each over a run of entries (runs of
  // 2500 or 1250 here): the entries where one run ends and the next begins are checked too.
  for (int i : {1249, 1250, 2499, 2500, 3749, 4999}) {
    CAPTURE(i);
    auto descriptor = b.bytes;
    descriptor[b.at.descriptor[size_t(i)] + 4] ^= 1;  // its CRC-32
    expect_error(descriptor, errc::corrupt, "data descriptor of 'arch/data/" + std::to_string(i) + "'",
                 b.at.descriptor[size_t(i)]);
    auto name = b.bytes;
    name[b.at.local[size_t(i)] + 30 + 5] ^= 0x20;  // a letter of its name
    expect_error(name, errc::corrupt, "differs from central directory name 'arch/data/" + std::to_string(i) + "'",
                 b.at.local[size_t(i)]);
  }
}

TEST_CASE("Z5 duplicate names") {
  SUBCASE("twin: distinct names") {
    expect_ok(build({{"a/x", {1}}, {"a/y", {2}}}).bytes);
  }
  SUBCASE("same name twice") {
    built b = build({{"a/x", {1}}, {"a/x", {2}}});
    expect_error(b.bytes, errc::corrupt, "duplicate entry name 'a/x'", b.at.central[1]);
  }
  SUBCASE("names equal after ASCII case folding") {
    expect_error(build({{"a/Data.pkl", {1}}, {"a/data.pkl", {2}}}).bytes, errc::corrupt,
                 "differ only in case");
  }
  SUBCASE("two central entries for one local header") {
    built b = build({{"a/x", {1}}, {"a/y", {2}}});
    patch32(b.bytes, b.at.central[1] + 42, uint32_t(b.at.local[0]));
    expect_error(b.bytes, errc::corrupt, "share local header offset");
  }
}

TEST_CASE("open_like: the names of the archive it repeats, in its order, instead of the duplicate check") {
  built model = build({{"a/x", {1}}, {"a/y", {2}}, {"a/z", {3}}});
  ckpt::memory_source model_src(model.bytes);
  auto like = ckpt::zip::archive::open(model_src);
  auto open_like = [&](const built& b) {
    ckpt::memory_source src(b.bytes);
    outcome o;
    try {
      auto a = ckpt::zip::archive::open_like(src, *like);
      o.ok = true;
      // No index: find scans, with the same answers.
      for (const auto& e : a->entries()) CHECK(a->find(e.record) == &e);
      CHECK(a->find("w") == nullptr);
      CHECK(a->find("a/x") == nullptr);
    } catch (const ckpt::error& e) {
      o.kind = e.kind();
      o.message = e.message();
      o.offset = e.offset();
    }
    return o;
  };
  SUBCASE("twin: the same names, other contents") {
    outcome o = open_like(build({{"a/x", {7, 7}}, {"a/y", {}}, {"a/z", {9}}}));
    CHECK_MESSAGE(o.ok, o.message);
  }
  SUBCASE("a name repeated where the model has another") {
    built b = build({{"a/x", {1}}, {"a/y", {2}}, {"a/y", {3}}});
    outcome o = open_like(b);
    REQUIRE_FALSE(o.ok);
    CHECK(o.kind == errc::corrupt);
    CHECK_MESSAGE(o.message.find("entry 2 is named 'a/y', in the archive it repeats 'a/z'") != std::string::npos,
                  o.message);
    CHECK(o.offset == b.at.central[2]);
  }
  SUBCASE("the same names in another order") {
    outcome o = open_like(build({{"a/y", {2}}, {"a/x", {1}}, {"a/z", {3}}}));
    REQUIRE_FALSE(o.ok);
    CHECK_MESSAGE(o.message.find("entry 0 is named 'a/y'") != std::string::npos, o.message);
  }
  SUBCASE("a name less or more") {
    outcome fewer = open_like(build({{"a/x", {1}}, {"a/y", {2}}}));
    CHECK_FALSE(fewer.ok);
    CHECK_MESSAGE(fewer.message.find("archive has 2 entries, the archive it repeats 3") != std::string::npos,
                  fewer.message);
    CHECK_FALSE(open_like(build({{"a/x", {1}}, {"a/y", {2}}, {"a/z", {3}}, {"a/w", {4}}})).ok);
  }
  SUBCASE("names differing only in case") {
    CHECK_FALSE(open_like(build({{"a/x", {1}}, {"a/Y", {2}}, {"a/z", {3}}})).ok);
  }
}

TEST_CASE("Z5 single top-level folder") {
  SUBCASE("two roots") {
    expect_error(build({{"a/data.pkl", {1}}, {"b/data.pkl", {2}}}).bytes, errc::corrupt,
                 "outside the top-level folder 'a'");
  }
  SUBCASE("first entry without a folder") {
    expect_error(build({{"data.pkl", {1}}}).bytes, errc::corrupt, "not inside a top-level folder");
  }
  SUBCASE("prefix is a whole path component") {
    expect_error(build({{"a/x", {1}}, {"ab/y", {2}}}).bytes, errc::corrupt, "outside");
  }
}

TEST_CASE("Z10 names and entry types") {
  auto one = [](std::string name) { return build({{"a/ok", {1}}, {std::move(name), {2}}}).bytes; };
  expect_ok(one("a/sub/dir/file.py"));
  expect_error(one("a/../x"), errc::corrupt, "'..' component");
  expect_error(one("a/./x"), errc::corrupt, "'.' component");
  expect_error(one("a//x"), errc::corrupt, "empty path component");
  expect_error(one("/a/x"), errc::corrupt, "absolute path");
  expect_error(one("a\\x"), errc::corrupt, "backslash");
  expect_error(one(std::string("a/x\0y", 5)), errc::corrupt, "NUL byte");
  expect_error(one("a/dir/"), errc::corrupt, "directory");
  expect_error(one("C:/x"), errc::corrupt, "drive letter");
  expect_error(one("a/\xff\xfe"), errc::corrupt, "not valid UTF-8");
  SUBCASE("symlink by Unix mode") {
    auto m = torch_like();
    m[1].made_by = 3 << 8;
    m[1].external = 0120777u << 16;
    expect_error(build(m).bytes, errc::corrupt, "symbolic link");
    m[1].external = 0100644u << 16;
    expect_ok(build(m).bytes);
  }
  SUBCASE("directory by DOS attribute") {
    auto m = torch_like();
    m[1].external = 0x10;
    expect_error(build(m).bytes, errc::corrupt, "directory");
  }
  SUBCASE("non-ASCII name without the UTF-8 flag") {
    auto m = torch_like();
    m[1].name = "arch/fran\x87" "ais";
    built b = build(m);
    // Clear bit 11 in both headers.
    patch16(b.bytes, b.at.local[1] + 6, 0x0008);
    patch16(b.bytes, b.at.central[1] + 8, 0x0008);
    expect_error(b.bytes, errc::corrupt, "lacks the UTF-8 flag");
  }
}

TEST_CASE("Z3 flag bits") {
  auto with_flags = [](uint16_t f) {
    auto m = torch_like();
    m[1].extra_flags = f;
    return build(m).bytes;
  };
  expect_ok(with_flags(0));
  expect_error(with_flags(0x0001), errc::unsupported, "encrypted entry");
  expect_error(with_flags(0x0040), errc::unsupported, "encrypted entry");
  expect_error(with_flags(0x2000), errc::unsupported, "encrypted entry");
  expect_error(with_flags(0x0020), errc::unsupported, "flag bits 0x20");
  expect_error(with_flags(0x0002), errc::unsupported, "flag bits 0x2");
  expect_error(with_flags(0x0080), errc::corrupt, "reserved flag bits 0x80");
}

TEST_CASE("Z4 local header disagrees with the central directory") {
  built good = build(torch_like());
  expect_ok(good.bytes);
  SUBCASE("name") {
    auto bytes = good.bytes;
    // "arch/data.pkl" -> "arch/datap.kl" in the local header only.
    const uint64_t name_at = good.at.local[0] + 30 + 9;
    bytes[name_at] = 'p';
    bytes[name_at + 1] = '.';
    expect_error(bytes, errc::corrupt,
                 "local header name 'arch/datap.kl' differs from central directory name 'arch/data.pkl'",
                 good.at.local[0]);
  }
  SUBCASE("name length") {
    auto bytes = good.bytes;
    patch16(bytes, good.at.local[0] + 26, 12);
    expect_error(bytes, errc::corrupt, "differs from central directory name");
  }
  SUBCASE("method") {
    auto bytes = good.bytes;
    patch16(bytes, good.at.local[1] + 8, 8);
    expect_error(bytes, errc::corrupt, "local header method 8", good.at.local[1]);
  }
  SUBCASE("flags") {
    auto bytes = good.bytes;
    patch16(bytes, good.at.local[1] + 6, 0x0008);
    expect_error(bytes, errc::corrupt, "local header flags 0x8");
  }
  SUBCASE("signature") {
    auto bytes = good.bytes;
    bytes[good.at.local[2]] = 'X';
    expect_error(bytes, errc::corrupt, "no local header signature", good.at.local[2]);
  }
  SUBCASE("CRC in the data descriptor") {
    auto bytes = good.bytes;
    patch32(bytes, good.at.descriptor[1] + 4, 0xDEADBEEF);
    expect_error(bytes, errc::corrupt, "data descriptor of 'arch/data/0'", good.at.descriptor[1]);
  }
  SUBCASE("size in the data descriptor") {
    auto bytes = good.bytes;
    patch32(bytes, good.at.descriptor[1] + 8, 41);
    expect_error(bytes, errc::corrupt, "data descriptor");
  }
  SUBCASE("descriptor signature missing") {
    auto bytes = good.bytes;
    bytes[good.at.descriptor[1]] = 'X';
    expect_error(bytes, errc::corrupt, "has no signature");
  }
  SUBCASE("CRC and sizes without a descriptor") {
    auto m = torch_like();
    for (auto& x : m) x.descriptor = false;
    built b = build(m);
    expect_ok(b.bytes);
    auto crc = b.bytes;
    patch32(crc, b.at.local[1] + 14, 0x12345678);
    expect_error(crc, errc::corrupt, "local header CRC-32 0x12345678");
    auto size = b.bytes;
    patch32(size, b.at.local[1] + 22, 39);
    expect_error(size, errc::corrupt, "local header sizes");
  }
  SUBCASE("local sizes with a descriptor may be zero or right, not wrong") {
    auto bytes = good.bytes;
    patch32(bytes, good.at.local[1] + 18, 40);
    patch32(bytes, good.at.local[1] + 22, 40);
    expect_ok(bytes);
    patch32(bytes, good.at.local[1] + 22, 4);
    expect_error(bytes, errc::corrupt, "local header sizes");
  }
}

TEST_CASE("Z2 CRC verification on request") {
  built b = build(torch_like());
  // A consistent lie: central directory and descriptor agree, the data does not.
  patch32(b.bytes, b.at.central[1] + 16, 0x0BADC0DE);
  patch32(b.bytes, b.at.descriptor[1] + 4, 0x0BADC0DE);
  ckpt::memory_source src(b.bytes);
  auto a = ckpt::zip::archive::open(src);
  a->verify_crc(a->entries()[0]);
  try {
    a->verify_crc(a->entries()[1]);
    FAIL("verify_crc accepted a wrong CRC");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::corrupt);
    CHECK(e.message().find("the central directory says 0xbadc0de") != std::string::npos);
  }
}

TEST_CASE("Z2 a zero CRC is not recorded, as torch.save writes with CRCs off") {
  built b = build(torch_like());
  // set_crc32_options(False): the central directory and the descriptor say 0.
  patch32(b.bytes, b.at.central[1] + 16, 0);
  patch32(b.bytes, b.at.descriptor[1] + 4, 0);
  ckpt::memory_source src(b.bytes);
  auto a = ckpt::zip::archive::open(src);
  const auto& e = a->entries()[1];
  REQUIRE(e.uncompressed_size > 0);
  uint64_t progressed = 0;
  const auto r = a->record_crc(e, [&](uint64_t n) { progressed = n; });
  CHECK(r.outcome == ckpt::zip::crc_outcome::not_recorded);
  CHECK(progressed == 0);  // not read
  a->verify_crc(e);        // and not an error
  // A record with a CRC is still checked by the same routine.
  const auto r0 = a->record_crc(a->entries()[0]);
  CHECK(r0.outcome == ckpt::zip::crc_outcome::match);
  CHECK(r0.computed == a->entries()[0].crc32);
}

TEST_CASE("Z6 overlaps and gaps") {
  SUBCASE("twin") { expect_ok(build(torch_like()).bytes); }
  SUBCASE("entry points into the middle of another") {
    built b = build(torch_like());
    patch32(b.bytes, b.at.central[1] + 42, uint32_t(b.at.local[0] + 10));
    expect_error(b.bytes, errc::corrupt, "cut off");
  }
  SUBCASE("entry points into another's data") {
    built b = build(torch_like());
    patch32(b.bytes, b.at.central[2] + 42, uint32_t(b.at.data[1] + 4));
    outcome o = try_open(b.bytes);
    CHECK_FALSE(o.ok);
    CHECK(o.kind == errc::corrupt);
  }
  SUBCASE("junk between entries, no descriptor") {
    auto m = torch_like();
    for (auto& x : m) x.descriptor = false;
    m[0].gap_after = {0, 0, 0};
    expect_error(build(m).bytes, errc::corrupt, "3 unaccounted bytes after the data of 'arch/data.pkl'");
  }
  SUBCASE("junk after a descriptor") {
    auto m = torch_like();
    m[1].gap_after = {1, 2, 3};
    expect_error(build(m).bytes, errc::corrupt, "19 bytes after the data of 'arch/data/0' do not form");
    // 16 + 4 bytes read as a 20-byte descriptor, which then disagrees.
    m[1].gap_after = {1, 2, 3, 4};
    expect_error(build(m).bytes, errc::corrupt, "data descriptor of 'arch/data/0'");
  }
  SUBCASE("junk between the last entry and the central directory") {
    auto m = torch_like();
    m[2].descriptor = false;
    m[2].gap_after = std::vector<uint8_t>(100, 'x');
    expect_error(build(m).bytes, errc::corrupt, "100 unaccounted bytes");
  }
  SUBCASE("descriptor missing") {
    built b = build({{"a/x", {1, 2, 3}, 0, false}, {"a/y", {4}}});
    // Claim a descriptor in both headers of the first entry, which has none.
    patch16(b.bytes, b.at.local[0] + 6, 0x0808);
    patch16(b.bytes, b.at.central[0] + 8, 0x0808);
    expect_error(b.bytes, errc::corrupt, "data descriptor of 'a/x' is missing");
  }
}

TEST_CASE("Z9 prefix, trailing junk and the end record") {
  SUBCASE("bytes before the first local header") {
    options o;
    o.lead = std::vector<uint8_t>(64, 'M');
    expect_error(build(torch_like(), o).bytes, errc::corrupt, "64 bytes before the first local header", 0);
  }
  SUBCASE("trailing junk") {
    options o;
    o.trailing = {'\n'};
    expect_error(build(torch_like(), o).bytes, errc::corrupt, "1 bytes of trailing data");
  }
  SUBCASE("a comment holding an end record signature is ambiguous") {
    options o;
    o.comment = std::string("made by test PK\x05\x06 ok", 21);
    built b = build(torch_like(), o);
    expect_error(b.bytes, errc::corrupt, "comment contains an end of central directory signature",
                 b.at.eocd + 22 + 13);
  }
  SUBCASE("comment length says more than there is") {
    options o;
    o.comment = "hello";
    built b = build(torch_like(), o);
    patch16(b.bytes, b.at.eocd + 20, 6);
    expect_error(b.bytes, errc::corrupt, "runs past the end of the file", b.at.eocd);
  }
  SUBCASE("comment length says less than there is") {
    options o;
    o.comment = "hello";
    built b = build(torch_like(), o);
    patch16(b.bytes, b.at.eocd + 20, 4);
    expect_error(b.bytes, errc::corrupt, "trailing data");
  }
  SUBCASE("no end record at all") {
    expect_error(std::vector<uint8_t>(1000, 'x'), errc::corrupt, "no end of central directory record");
  }
  SUBCASE("too small") {
    expect_error(bytes_of("PK\x03\x04"), errc::corrupt, "too few");
  }
  SUBCASE("central directory does not end at the end record") {
    built b = build(torch_like());
    patch64(b.bytes, b.at.zip64_end + 40, b.at.cd_size - 1);
    patch32(b.bytes, b.at.eocd + 12, uint32_t(b.at.cd_size - 1));
    expect_error(b.bytes, errc::corrupt, "between the central directory and the end record");
  }
  SUBCASE("end record and ZIP64 end record disagree") {
    built b = build(torch_like());
    patch32(b.bytes, b.at.eocd + 16, uint32_t(b.at.cd_offset + 1));
    expect_error(b.bytes, errc::corrupt, "disagrees with the ZIP64 end record");
  }
  SUBCASE("entry count lie") {
    options o;
    o.zip64_end = false;
    built b = build(torch_like(), o);
    patch16(b.bytes, b.at.eocd + 8, 4);
    patch16(b.bytes, b.at.eocd + 10, 4);
    expect_error(b.bytes, errc::corrupt, "4 entries cannot fit in a central directory");
    patch16(b.bytes, b.at.eocd + 8, 2);
    patch16(b.bytes, b.at.eocd + 10, 2);
    expect_error(b.bytes, errc::corrupt, "unused bytes at the end of the central directory");
  }
  SUBCASE("entry count beyond what the central directory can hold") {
    built b = build(torch_like());
    patch16(b.bytes, b.at.eocd + 8, 0xFFFF);
    patch16(b.bytes, b.at.eocd + 10, 0xFFFF);
    patch64(b.bytes, b.at.zip64_end + 24, uint64_t(1) << 40);
    patch64(b.bytes, b.at.zip64_end + 32, uint64_t(1) << 40);
    expect_error(b.bytes, errc::corrupt, "cannot fit in a central directory");
  }
  SUBCASE("multi-disk") {
    options o;
    o.zip64_end = false;
    built b = build(torch_like(), o);
    patch16(b.bytes, b.at.eocd + 4, 1);
    expect_error(b.bytes, errc::unsupported, "multi-disk");
  }
  SUBCASE("no entries") {
    expect_error(build({}).bytes, errc::corrupt, "no entries");
  }
  SUBCASE("ZIP64 locator pointing nowhere") {
    built b = build(torch_like());
    patch64(b.bytes, b.at.locator + 8, b.at.zip64_end + 1);
    expect_error(b.bytes, errc::corrupt, "ZIP64");
  }
}

TEST_CASE("Z7 declared sizes that lie") {
  SUBCASE("stored size past the end of the file") {
    built b = build(torch_like());
    patch32(b.bytes, b.at.central[2] + 20, 1000000);
    patch32(b.bytes, b.at.central[2] + 24, 1000000);
    expect_error(b.bytes, errc::corrupt, "runs past the central directory", b.at.data[2]);
  }
  SUBCASE("stored with compressed != uncompressed") {
    built b = build(torch_like());
    patch32(b.bytes, b.at.central[1] + 24, 41);
    expect_error(b.bytes, errc::corrupt, "stored entry 'arch/data/0' has compressed size 40");
  }
  SUBCASE("local header offset past the end of the file") {
    built b = build(torch_like());
    patch32(b.bytes, b.at.central[2] + 42, 0x7FFFFFFF);
    expect_error(b.bytes, errc::corrupt, "not before the central directory");
  }
  SUBCASE("central directory offset past the end of the file") {
    built b = build(torch_like());
    patch64(b.bytes, b.at.zip64_end + 48, uint64_t(1) << 62);
    patch32(b.bytes, b.at.eocd + 16, 0xFFFFFFFF);
    outcome o = try_open(b.bytes);
    CHECK_FALSE(o.ok);
    CHECK(o.kind == errc::corrupt);
  }
  SUBCASE("deflate size beyond what deflate can produce") {
    auto m = torch_like();
    m.push_back({"arch/code.py", std::vector<uint8_t>(1000, 'a'), 8, false});
    built b = build(m);
    patch32(b.bytes, b.at.central[3] + 24, 0x7FFFFFFF);
    patch32(b.bytes, b.at.local[3] + 22, 0x7FFFFFFF);
    expect_error(b.bytes, errc::corrupt, "more than deflate can produce");
  }
}

TEST_CASE("Z8 ZIP64 sentinels") {
  SUBCASE("sentinel without its extra field") {
    built b = build(torch_like());
    patch32(b.bytes, b.at.central[1] + 24, 0xFFFFFFFF);
    expect_error(b.bytes, errc::corrupt, "ZIP64 sentinel but no ZIP64 extra field", b.at.central[1]);
  }
  SUBCASE("extra field longer than the sentinels call for") {
    auto m = torch_like();
    m[1].zip64_central = true;
    built b = build(m);
    patch32(b.bytes, b.at.central[1] + 42, uint32_t(b.at.local[1]));  // offset no longer a sentinel
    expect_error(b.bytes, errc::corrupt, "its sentinels call for 16");
  }
  SUBCASE("local sentinel without ZIP64 sizes") {
    auto m = torch_like();
    m[1].descriptor = false;
    built b = build(m);
    patch32(b.bytes, b.at.local[1] + 18, 0xFFFFFFFF);
    patch32(b.bytes, b.at.local[1] + 22, 0xFFFFFFFF);
    expect_error(b.bytes, errc::corrupt, "no ZIP64 sizes");
  }
  SUBCASE("extra field overruns the extra area") {
    auto m = torch_like();
    m[0].local_extra = {0x01, 0x00, 0x40, 0x00, 1, 2};
    expect_error(build(m).bytes, errc::corrupt, "runs past the extra area");
  }
  SUBCASE("many entries: 16-bit count sentinel resolved through the ZIP64 end record") {
    std::vector<member> m;
    for (int i = 0; i < 70000; ++i) m.push_back({"big/r" + std::to_string(i), {uint8_t(i)}});
    built b = build(m);
    patch16(b.bytes, b.at.eocd + 8, 0xFFFF);
    patch16(b.bytes, b.at.eocd + 10, 0xFFFF);
    ckpt::memory_source src(b.bytes);
    auto a = ckpt::zip::archive::open(src);
    CHECK(a->entries().size() == 70000);
    CHECK(a->read_record(*a->find("r69999")) == std::vector<uint8_t>{uint8_t(69999)});
  }
}

TEST_CASE("deflate bombs and size caps") {
  const std::vector<uint8_t> zeros(8 << 20, 0);
  auto m = torch_like();
  m.push_back({"arch/code/bomb.py", zeros, 8});
  built b = build(m);
  ckpt::memory_source src(b.bytes);
  SUBCASE("twin: within the default caps") {
    auto a = ckpt::zip::archive::open(src);
    const auto* e = a->find("code/bomb.py");
    CHECK(e->compressed_size < 64 * 1024);
    CHECK(a->read_record(*e) == zeros);
  }
  SUBCASE("record over max_record_bytes") {
    ckpt::zip::open_options opt;
    opt.max_record_bytes = 1 << 20;
    auto a = ckpt::zip::archive::open(src, opt);
    CHECK_THROWS_AS(a->read_record(*a->find("code/bomb.py")), ckpt::error);
    try {
      a->read_record(*a->find("code/bomb.py"));
    } catch (const ckpt::error& e) {
      CHECK(e.kind() == errc::limit);
    }
    a->verify_crc(*a->find("code/bomb.py"));  // streams: no cap needed
  }
  SUBCASE("total over max_inflated_total") {
    ckpt::zip::open_options opt;
    opt.max_inflated_total = 1 << 20;
    outcome o = try_open(b.bytes, opt);
    CHECK_FALSE(o.ok);
    CHECK(o.kind == errc::limit);
  }
  SUBCASE("inflates to more than declared") {
    auto m2 = torch_like();
    m2.push_back({"arch/code/bomb.py", std::vector<uint8_t>(100000, 0), 8, false});
    built b2 = build(m2);
    patch32(b2.bytes, b2.at.central[3] + 24, 1000);
    patch32(b2.bytes, b2.at.local[3] + 22, 1000);
    ckpt::memory_source src2(b2.bytes);
    auto a = ckpt::zip::archive::open(src2);
    try {
      a->read_record(*a->find("code/bomb.py"));
      FAIL("inflated past the declared size");
    } catch (const ckpt::error& e) {
      CHECK(e.kind() == errc::corrupt);
      CHECK(e.message().find("more than its declared 1000 bytes") != std::string::npos);
    }
  }
  SUBCASE("inflates to less than declared") {
    auto m2 = torch_like();
    m2.push_back({"arch/code/short.py", std::vector<uint8_t>(1000, 'a'), 8, false});
    built b2 = build(m2);
    patch32(b2.bytes, b2.at.central[3] + 24, 1001);
    patch32(b2.bytes, b2.at.local[3] + 22, 1001);
    ckpt::memory_source src2(b2.bytes);
    auto a = ckpt::zip::archive::open(src2);
    CHECK_THROWS_AS(a->read_record(*a->find("code/short.py")), ckpt::error);
  }
}

TEST_CASE("errors name the file") {
  built b = build({{"a/x", {1}}, {"a/x", {2}}});
  ckpt::memory_source src(b.bytes, "model.pt");
  try {
    ckpt::zip::archive::open(src);
    FAIL("opened");
  } catch (const ckpt::error& e) {
    CHECK(std::string(e.what()).rfind("model.pt: byte ", 0) == 0);
  }
}

TEST_CASE("every single-byte corruption is either read or refused with ckpt::error") {
  auto m = torch_like();
  m[1].zip64_central = true;
  std::vector<uint8_t> text(600);
  for (size_t i = 0; i < text.size(); ++i) text[i] = uint8_t("def f(x):\n  return x\n"[i % 21]);
  m.push_back({"arch/code/x.py", text, 8});
  const built b = build(m);
  size_t opened = 0, refused = 0;
  for (size_t pos = 0; pos < b.bytes.size(); ++pos) {
    for (uint8_t flip : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xFF)}) {
      auto bytes = b.bytes;
      bytes[pos] ^= flip;
      ckpt::memory_source src(bytes);
      try {
        auto a = ckpt::zip::archive::open(src);
        for (const auto& e : a->entries()) {
          try {
            a->read_record(e);
            a->verify_crc(e);
          } catch (const ckpt::error&) {
          }
        }
        ++opened;
      } catch (const ckpt::error&) {
        ++refused;
      }
    }
  }
  CHECK(opened > 0);  // flips inside stored data still open (the CRC check catches them)
  CHECK(refused > opened);
}

TEST_CASE("crc32_update matches zlib's check value") {
  const char* s = "123456789";
  CHECK(ckpt::zip::crc32_update(0, s, 9) == 0xCBF43926u);
  uint32_t c = ckpt::zip::crc32_update(0, s, 4);
  CHECK(ckpt::zip::crc32_update(c, s + 4, 5) == 0xCBF43926u);
}

}  // TEST_SUITE
