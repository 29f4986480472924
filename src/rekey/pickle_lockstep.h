// Internal: tells that a pickle is another one with only some str operands changed, by
// walking the old one's opcodes and comparing the bytes between the changed ones, without
// decoding either (docs/formats.md §3.1.1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ckpt/pickle.h"

namespace ckpt::detail {

/// A str node renamed in place: `pos` is the offset in the old pickle of the opcode that
/// made it, `text` its new text.
struct renamed_str {
  uint64_t pos;
  std::string_view text;
};

/// True when `now` is `before` opcode for opcode and byte for byte, except at each
/// renamed[i].pos (sorted, distinct), where `before` has a str opcode and `now` has a
/// SHORT_BINUNICODE, BINUNICODE or BINUNICODE8 opcode holding renamed[i].text, which the
/// reader accepts under `lim` (valid UTF-8, within max_string); `now` is within
/// max_pickle_bytes. False at the first difference, at an opcode it does not know, at a
/// position that is not an opcode's start: the caller then decodes `now` in full.
bool same_but_renamed(const uint8_t* before, size_t before_size, const uint8_t* now, size_t now_size,
                      const std::vector<renamed_str>& renamed, const pickle::limits& lim);

}  // namespace ckpt::detail
