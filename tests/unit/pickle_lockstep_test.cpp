// detail::same_but_renamed (src/rekey/pickle_lockstep.h): when rekey may skip decoding the
// pickle it wrote. Every answer but "the same pickle with these texts" must be false, so
// that the full decode runs.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "rekey/pickle_lockstep.h"

using ckpt::detail::renamed_str;
using ckpt::detail::same_but_renamed;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// BINUNICODE with its 4-byte length.
std::string binunicode(const std::string& text) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out += char((text.size() >> (8 * i)) & 0xFF);
  return out + text;
}

// {'a': 1, 'b': 2} as protocol 2 writes it; the keys' opcodes at 6 and 16.
std::string dict_pickle(const std::string& a, const std::string& b, const std::string& tail = "u.") {
  return std::string("\x80\x02}q\x00(", 6) + binunicode(a) + std::string("q\x01K\x01", 4) + binunicode(b) +
         std::string("q\x02K\x02", 4) + tail;
}

bool same(const std::string& before, const std::string& now, const std::vector<renamed_str>& renamed,
          const ckpt::pickle::limits& lim = {}) {
  const auto x = bytes(before), y = bytes(now);
  return same_but_renamed(x.data(), x.size(), y.data(), y.size(), renamed, lim);
}

}  // namespace

TEST_CASE("the same pickle, with and without renamed keys") {
  const std::string in = dict_pickle("a", "b");
  CHECK(same(in, in, {}));
  CHECK(same(in, dict_pickle("x.a", "b"), {{6, "x.a"}}));
  CHECK(same(in, dict_pickle("x.a", "x.b"), {{6, "x.a"}, {16, "x.b"}}));
  // The renamed text must be what was meant.
  CHECK_FALSE(same(in, dict_pickle("x.a", "b"), {{6, "y.a"}}));
  // A change nobody asked for.
  CHECK_FALSE(same(in, dict_pickle("x.a", "b"), {}));
  CHECK_FALSE(same(in, dict_pickle("a", "c"), {{6, "a"}}));
  // A rename that did not happen in the output, or at no opcode's start, or at no str.
  CHECK_FALSE(same(in, in, {{6, "x.a"}}));
  CHECK_FALSE(same(in, in, {{7, "a"}}));
  CHECK_FALSE(same(in, in, {{2, "a"}}));
  CHECK_FALSE(same(in, in, {{6, "a"}, {1000, "b"}}));
}

TEST_CASE("the end of the pickles") {
  const std::string in = dict_pickle("a", "b");
  CHECK_FALSE(same(in, in + "x", {}));
  CHECK_FALSE(same(in + "x", in, {}));
  CHECK_FALSE(same(in, in.substr(0, in.size() - 1), {}));
  // CPython's empty last batch (a dict of 1000 k items): nothing, right after a SETITEMS.
  CHECK(same(dict_pickle("a", "b", "u(u."), in, {}));
  CHECK(same(dict_pickle("a", "b", "u(u."), dict_pickle("x.a", "b"), {{6, "x.a"}}));
  // Not after a SETITEMS: an empty SETITEMS on an object would make its dict slot.
  CHECK_FALSE(same(std::string("\x80\x02}(u.", 5), std::string("\x80\x02}.", 4), {}));
}

TEST_CASE("a text the reader would refuse") {
  const std::string in = dict_pickle("a", "b");
  CHECK_FALSE(same(in, dict_pickle("\xff", "b"), {{6, "\xff"}}));
  ckpt::pickle::limits lim;
  lim.max_string = 2;
  CHECK_FALSE(same(in, dict_pickle("x.a", "b"), {{6, "x.a"}}, lim));
  lim = {};
  lim.max_pickle_bytes = in.size();
  CHECK_FALSE(same(in, dict_pickle("x.a", "b"), {{6, "x.a"}}, lim));
}

TEST_CASE("opcodes it does not walk") {
  // FRAME (protocol 4) holds a length that renamed texts would change.
  const std::string framed = std::string("\x80\x04\x95\x01\x00\x00\x00\x00\x00\x00\x00N.", 13);
  CHECK_FALSE(same(framed, framed, {}));
  const std::string unknown = std::string("\x80\x02\xff.", 4);
  CHECK_FALSE(same(unknown, unknown, {}));
}
