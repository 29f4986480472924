// Internal: identify a file by its first bytes, never by its name (security.md Z1).
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/byte_source.h"

namespace ckpt::detail {

enum class sniffed {
  zip,
  legacy_pickle,
  safetensors,
  bare_pickle,  // a pickle stream that is not a torch file: refused, after naming its globals
  maybe_pickle, // starts like a protocol 0/1 pickle: a pickle if the machine can read it
};

/// "unrecognized format (first bytes: ...)" for content nothing claims.
[[noreturn]] void throw_unrecognized(const byte_source& src);

/// Returns what the content says the file is, or throws ckpt::error (unsupported or
/// corrupt) with a message that names the format found and what to do about it.
sniffed sniff_format(const byte_source& src);

}  // namespace ckpt::detail
