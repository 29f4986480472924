#include "rekey/pickle_lockstep.h"

#include <cstring>

#include "base/byteio.h"
#include "pickle/pickle_text.h"
#include "pickle/pickle_opcodes.h"

namespace ckpt::detail {
namespace {

using namespace pickle::op;
using ckpt::load_u32;
using ckpt::load_u64;

// The length of the opcode at p (opcode byte and operands), or 0 for an opcode this walk
// does not know or one cut short by the end.
size_t opcode_length(const uint8_t* p, size_t avail) {
  if (avail == 0) return 0;
  auto fixed = [avail](size_t n) { return n + 1 <= avail ? n + 1 : 0; };
  auto counted = [p, avail](size_t width) -> size_t {
    if (1 + width > avail) return 0;
    uint64_t n = width == 1 ? p[1] : width == 4 ? load_u32(p + 1) : load_u64(p + 1);
    if (n > avail - 1 - width) return 0;
    return size_t(1 + width + n);
  };
  auto lines = [p, avail](int count) -> size_t {
    size_t at = 1;
    for (int i = 0; i < count; ++i) {
      const void* nl = std::memchr(p + at, '\n', avail - at);
      if (!nl) return 0;
      at = size_t(static_cast<const uint8_t*>(nl) - p) + 1;
    }
    return at;
  };
  switch (p[0]) {
    case MARK: case STOP: case POP: case POP_MARK: case DUP: case NONE: case BINPERSID: case REDUCE:
    case APPEND: case BUILD: case DICT: case EMPTY_DICT: case APPENDS: case LIST: case EMPTY_LIST:
    case OBJ: case SETITEM: case TUPLE: case EMPTY_TUPLE: case SETITEMS: case NEWOBJ: case TUPLE1:
    case TUPLE2: case TUPLE3: case NEWTRUE: case NEWFALSE: case EMPTY_SET: case ADDITEMS:
    case FROZENSET: case NEWOBJ_EX: case STACK_GLOBAL: case MEMOIZE: case NEXT_BUFFER:
    case READONLY_BUFFER:
      return 1;
    case BININT1: case BINGET: case BINPUT: case EXT1: case PROTO:
      return fixed(1);
    case BININT2: case EXT2:
      return fixed(2);
    case BININT: case LONG_BINGET: case LONG_BINPUT: case EXT4:
      return fixed(4);
    case BINFLOAT:
      return fixed(8);
    case SHORT_BINSTRING: case SHORT_BINBYTES: case SHORT_BINUNICODE: case LONG1:
      return counted(1);
    case BINSTRING: case BINBYTES: case BINUNICODE: case LONG4:
      return counted(4);
    case BINUNICODE8: case BINBYTES8: case BYTEARRAY8:
      return counted(8);
    case INT: case LONG: case FLOAT: case STRING: case UNICODE: case PERSID: case GET: case PUT:
      return lines(1);
    case GLOBAL: case INST:
      return lines(2);
    default:
      return 0;  // FRAME among them: its length would change with the texts
  }
}

bool makes_str(uint8_t code) {
  return code == SHORT_BINUNICODE || code == BINUNICODE || code == BINUNICODE8 || code == UNICODE;
}

// The text of a binary str opcode of length `len` at p.
std::string_view str_operand(const uint8_t* p, size_t len) {
  const size_t width = p[0] == SHORT_BINUNICODE ? 1 : p[0] == BINUNICODE ? 4 : 8;
  return {reinterpret_cast<const char*>(p + 1 + width), len - 1 - width};
}

}  // namespace

bool same_but_renamed(const uint8_t* before, size_t before_size, const uint8_t* now, size_t now_size,
                      const std::vector<renamed_str>& renamed, const pickle::limits& lim) {
  if (now_size > lim.max_pickle_bytes) return false;
  // Only `before`'s opcodes are walked: between two renamed texts `now` must hold the same
  // bytes, which then are the same opcodes, so each such run is compared whole (decoding
  // both pickles' opcodes was most of this check's time for a million tensors).
  size_t i = 0, j = 0, next = 0;
  size_t run_i = 0, run_j = 0;  // where the bytes still to compare start in each
  auto same_run = [&] {
    const size_t n = i - run_i;  // == j - run_j
    return run_j + n <= now_size && std::memcmp(before + run_i, now + run_j, n) == 0;
  };
  uint8_t last = 0;  // the previous opcode of `before`
  while (i < before_size && j < now_size) {
    // CPython's pickler ends a dict of a multiple of 1000 items with an empty batch, MARK
    // SETITEMS, which ckptool's writer leaves out. Right after a SETITEMS, on the same
    // target, it changes nothing: the items it would set are none, and an object's dict
    // slot the first one made is there already.
    if (last == SETITEMS && before[i] == MARK && i + 1 < before_size && before[i + 1] == SETITEMS &&
        !(now[j] == MARK && j + 1 < now_size && now[j + 1] == SETITEMS)) {
      if (!same_run()) return false;
      i += 2;
      run_i = i;
      run_j = j;
      continue;
    }
    const size_t a = opcode_length(before + i, before_size - i);
    if (a == 0) return false;
    if (next < renamed.size() && renamed[next].pos < i) return false;  // inside an opcode
    if (next < renamed.size() && renamed[next].pos == i) {
      if (!same_run()) return false;
      const size_t b = opcode_length(now + j, now_size - j);
      if (b == 0) return false;
      const std::string_view want = renamed[next++].text;
      if (!makes_str(before[i]) || !(now[j] == SHORT_BINUNICODE || now[j] == BINUNICODE || now[j] == BINUNICODE8))
        return false;
      if (str_operand(now + j, b) != want || want.size() > lim.max_string || !pickle::detail::valid_utf8(want, true)) return false;
      last = before[i];
      i += a;
      j += b;
      run_i = i;
      run_j = j;
      continue;
    }
    last = before[i];
    const bool stop = before[i] == STOP;
    i += a;
    j += a;
    // Both end at the same STOP, with nothing after it in either.
    if (stop) return same_run() && i == before_size && j == now_size && next == renamed.size();
  }
  return false;
}

}  // namespace ckpt::detail
