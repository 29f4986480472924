// Test helper: decodes a pickle with ckpt::pickle::parse and writes it back with
// ckpt::pickle::write (protocol 2) to stdout, so Python tests can load the result with
// CPython and compare it with the original object.
//   pickle_roundtrip FILE > OUT
// Exit status: 0, or the ckptool exit code of the error (one line on stderr).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/pickle.h"
#include "ckpt/pickle_writer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: pickle_roundtrip FILE > OUT\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "pickle_roundtrip: cannot open %s\n", argv[1]);
    return 4;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  try {
    ckpt::pickle::document doc = ckpt::pickle::parse(bytes.data(), bytes.size());
    std::vector<uint8_t> out = ckpt::pickle::write(doc.root, 2, &doc);
    if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) return 4;
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "pickle_roundtrip: %s: %s\n", ckpt::errc_name(e.kind()), e.what());
    return ckpt::exit_code(e.kind());
  }
  return 0;
}
