// `rekey --rename REGEX=REPLACEMENT` with RE2: linear-time matching and no recursion on the
// key's length, whatever the pattern (std::regex overflowed the stack on 50,000-character
// keys and backtracked exponentially on `(a|aa)*c`).
#pragma once

#include <string>

#include "ckpt/rekey.h"

namespace ckpt {

/// Every match of the op's pattern in `key` replaced, left to right (as re.sub does).
std::string apply_rename(const key_op& op, const std::string& key);

}  // namespace ckpt
