// The one-pass .metadata decoder against the tree decoder, its reference (docs/formats.md
// §9.11): on real files both give the same metadata, and on every single-byte mutation of a
// real file the one-pass decoder either declines or gives exactly what the tree decoder
// gives (a file the tree refuses must never be taken).
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "dcp_metadata_text.h"
#include "formats/dcp_metadata_decoders.h"

namespace {

std::vector<uint8_t> file(const std::string& rel) {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/" + rel, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), rel);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// "" when the tree refuses the bytes, else its metadata as text.
std::string tree_text(const std::vector<uint8_t>& b, const ckpt::dcp::decode_options& o = {}) {
  try {
    return ckpt::fuzz::dcp_metadata_text(ckpt::dcp::detail::decode_metadata_tree(b.data(), b.size(), o));
  } catch (const ckpt::error&) {
    return "";
  }
}

// What the one-pass decoder gives, "declined" when it declines.
std::string stream_text(const std::vector<uint8_t>& b, const ckpt::dcp::decode_options& o = {}) {
  ckpt::dcp::metadata md;
  if (!ckpt::dcp::detail::decode_metadata_stream(b.data(), b.size(), o, &md)) return "declined";
  return ckpt::fuzz::dcp_metadata_text(md);
}

// Real dcp.save output (tests/data, and the fuzz seeds written by real writers).
const char* const kReal[] = {
    "tests/data/dcp/small/.metadata",            "tests/data/dcp/twin.metadata",
    "tests/data/dcp/gap.metadata",               "tests/data/dcp/overlap.metadata",
    "tests/data/diff/sharded/.metadata",         "fuzz/seeds/dcp_metadata/fsdp2.metadata",
    "fuzz/seeds/dcp_metadata/grid4.metadata",    "fuzz/seeds/dcp_metadata/nocoll2_rank0.metadata",
    "fuzz/seeds/dcp_metadata/nocoll2_rank1.metadata", "fuzz/seeds/dcp_metadata/perfile2.metadata",
    "fuzz/seeds/dcp_metadata/shard2.metadata",   "fuzz/seeds/dcp_metadata/threads2.metadata",
    "fuzz/seeds/dcp_metadata/zero_size.metadata", "fuzz/seeds/dcp_metadata/zstd.metadata",
};

}  // namespace

TEST_CASE("dcp metadata stream: real files decode as the tree decodes them") {
  for (const char* rel : kReal) {
    CAPTURE(rel);
    const std::vector<uint8_t> b = file(rel);
    const std::string tree = tree_text(b);
    REQUIRE(!tree.empty());
    CHECK(stream_text(b) == tree);
    // decode_metadata (the one callers use) gives the same too.
    CHECK(ckpt::fuzz::dcp_metadata_text(ckpt::dcp::decode_metadata(b.data(), b.size())) == tree);
  }
}

TEST_CASE("dcp metadata stream: forms it leaves to the tree decoder") {
  // Hand-built or unusual: protocol 2 (Python 2 names), a field Megatron adds, a value
  // popped off the stack. Each the tree decides; the stream decoder declines.
  for (const char* rel : {"fuzz/seeds/dcp_metadata/proto2.metadata", "fuzz/seeds/dcp_metadata/mcore_extra_field.metadata",
                          "fuzz/seeds/dcp_metadata/payload_popped.metadata"}) {
    CAPTURE(rel);
    const std::vector<uint8_t> b = file(rel);
    CHECK(stream_text(b) == "declined");
    const std::string tree = tree_text(b);
    if (!tree.empty()) CHECK(ckpt::fuzz::dcp_metadata_text(ckpt::dcp::decode_metadata(b.data(), b.size())) == tree);
  }
}

// Under AddressSanitizer the exhaustive loop below takes ~100 s against ~6.5 s, and the CI
// runs the unit tests twice there (the second time for leaks). There every offset still gets
// its eight single-bit flips and the boundary values; the fuzz target dcp_metadata compares
// the two decoders on mutations at random besides.
#if defined(__SANITIZE_ADDRESS__)
#define CKPT_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPT_TEST_UNDER_ASAN 1
#endif
#endif
#ifdef CKPT_TEST_UNDER_ASAN
static bool mutation_tried(uint8_t original, int v) {
  const int flipped = original ^ v;
  return (flipped & (flipped - 1)) == 0 || v == 0 || v == 0xff || v == 0x7f || v == 0x80;
}
#else
static bool mutation_tried(uint8_t, int) { return true; }
#endif

TEST_CASE("dcp metadata stream: every single-byte mutation is declined or decoded as the tree decodes it") {
  for (const char* rel : {"tests/data/dcp/small/.metadata", "fuzz/seeds/dcp_metadata/zstd.metadata"}) {
    CAPTURE(rel);
    const std::vector<uint8_t> original = file(rel);
    const std::string name = rel;
    CAPTURE(name);
    size_t taken = 0, cases = 0;
    std::vector<uint8_t> b = original;
    for (size_t i = 0; i < b.size(); ++i) {
      for (int v = 0; v < 256; ++v) {
        if (v == original[i] || !mutation_tried(original[i], v)) continue;
        b[i] = uint8_t(v);
        ++cases;
        const std::string s = stream_text(b);
        if (s != "declined") {
          ++taken;
          const std::string tree = tree_text(b);
          if (s != tree) {
            CAPTURE(i);
            CAPTURE(v);
            CHECK(s == tree);
          }
        }
      }
      b[i] = original[i];
    }
    MESSAGE(rel << ": " << cases << " mutations, " << taken << " taken by the one-pass decoder");
    CHECK(taken > 0);  // the comparison is not vacuous
  }
}

TEST_CASE("dcp metadata stream: a limit the tree would hit is declined, never passed") {
  const std::vector<uint8_t> b = file("tests/data/dcp/small/.metadata");
  for (int which = 0; which < 6; ++which) {
    CAPTURE(which);
    ckpt::dcp::decode_options o;
    switch (which) {
      case 0: o.lim.max_values = 50; break;
      case 1: o.lim.max_memo = 10; break;
      case 2: o.lim.max_stack = 4; break;
      case 3: o.lim.max_depth = 3; break;
      case 4: o.lim.max_container = 1; break;
      case 5: o.lim.max_string = 8; break;
    }
    CHECK(tree_text(b, o).empty());
    CHECK(stream_text(b, o) == "declined");
  }
}
