// The key-edit options rekey and convert share (--strip-compiled, --strip-wrappers,
// --strip-prefix, --add-prefix, --add-compiled, --rename, --match, --map): registered once,
// turned into ckpt::key_op operations in command-line order.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/rekey.h"
#include "load_guard.h"

namespace cli {

struct key_edit_flags {
  CLI::App* cmd = nullptr;
  // Option objects whose occurrences, in command-line order, are the operations.
  CLI::Option *strip_compiled = nullptr, *strip_wrappers = nullptr, *strip_prefix = nullptr, *add_prefix = nullptr,
              *add_compiled = nullptr, *rename = nullptr, *map = nullptr, *match = nullptr;
};

/// Registers the operations on `cmd`, in their own help group (`group`). Without
/// `with_match`, --match is left out (diff pairs keys through its solver already).
void add_key_edit_flags(CLI::App& cmd, key_edit_flags& f, const std::string& group = "Operations (applied in the order given)",
                        bool with_match = true);

/// The tensors --match aligns (the state dict's, or every shard's of a set), and the file
/// its messages name.
struct match_source {
  std::function<std::vector<ckpt::keyed_tensor>()> tensors;
  std::string path;
};

/// The operations given, in command-line order; --match solved against `source` (after the
/// operations before it), its target opened with `reader` and `code`.
std::vector<ckpt::key_op> key_ops_in_order(const key_edit_flags& f, const match_source& source,
                                           const ckpt::open_options& reader, const code_options& code);

}  // namespace cli
