// Test helper: one key's elements as diff reads them (src/diff/key_reader, then
// element_decode), which tests/py/test_diff.py compares with torch's own values: every bit
// pattern of the small floats, strided views, DCP tensors assembled from pieces.
//   decode_elements FILE KEY [WINDOW_ELEMENTS]
// Prints one JSON array: per element [re, im] as "%.17g" strings ("nan", "inf", "-inf"),
// or, for a dtype without a numeric decode, its bytes as a hex string. Reads in windows of
// WINDOW_ELEMENTS (default 1000), so window edges fall inside runs and pieces. Exit status:
// 0, or the ckptool exit code of the error, whose one line goes to stderr.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "diff/element_decode.h"
#include "diff/key_reader.h"
#include "model/assembly.h"

namespace {

std::string number(double v) {
  if (std::isnan(v)) return "nan";  // its sign and payload are not a value
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: decode_elements FILE KEY [WINDOW_ELEMENTS]\n");
    return 2;
  }
  try {
    const ckpt::checkpoint c = ckpt::open_checkpoint(argv[1]);
    const std::string key = argv[2];
    const uint64_t window = argc > 3 ? std::stoull(argv[3]) : 1000;
    size_t k = c.keys.size();
    for (size_t i = 0; i < c.keys.size(); ++i)
      if (c.keys.key(i) == key) k = i;
    if (k == c.keys.size()) throw ckpt::error(ckpt::errc::usage, "no key '" + key + "'");
    const ckpt::detail::assembly a = ckpt::detail::plan_assembly(c, {k});
    ckpt::detail::key_reader r = a.tensors.empty()
                                     ? ckpt::detail::key_reader(c, key, c.keys.tensor(k))
                                     : ckpt::detail::key_reader(c, key, a, a.tensors[0]);
    const uint64_t element = ckpt::element_size(r.type());
    const bool numeric = ckpt::detail::number_kind_of(r.type()) != ckpt::detail::number_kind::none;
    std::vector<uint8_t> buf;
    std::cout << "[";
    bool first = true;
    for (uint64_t at = 0; at < r.nbytes(); at += window * element) {
      const uint64_t n = std::min<uint64_t>(window * element, r.nbytes() - at);
      buf.resize(size_t(n));
      r.read(at, size_t(n), buf.data());
      for (uint64_t e = 0; e < n; e += element) {
        std::cout << (first ? "" : ",");
        first = false;
        if (!numeric) {
          std::string hex;
          for (uint64_t b = 0; b < element; ++b) {
            char two[3];
            std::snprintf(two, sizeof two, "%02x", buf[size_t(e + b)]);
            hex += two;
          }
          std::cout << "\"" << hex << "\"";
          continue;
        }
        const ckpt::detail::element_value v = ckpt::detail::decode_element(r.type(), buf.data() + e);
        std::cout << "[\"" << number(v.re) << "\",\"" << number(v.im) << "\"]";
      }
    }
    std::cout << "]\n";
  } catch (const ckpt::error& e) {
    std::cerr << e.one_line() << "\n";
    return ckpt::exit_code(e.kind());
  }
  return 0;
}
