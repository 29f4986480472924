// The process group of a command launched by torchrun (docs/distributed.md): one process
// alone when the launcher's variables are absent (or WORLD_SIZE is 1), else the c10d group
// of the torch plugin, which only then is loaded.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "ckpt/distributed.h"

namespace cli {

struct distributed_flags {
  unsigned timeout_seconds = 300;
};

/// --dist-timeout SECONDS.
void add_distributed_flags(CLI::App& cmd, distributed_flags& flags);

/// This process's group. Ranks other than 0 are quiet from here on: only errors are logged.
/// Throws errc::usage for inconsistent launcher variables, errc::unsupported when the
/// plugin cannot be loaded, errc::io when the rendezvous fails.
std::unique_ptr<ckpt::process_group> open_process_group(const distributed_flags& flags);

/// True once open_process_group joined a group of several processes: main() then ends the
/// process without LibTorch's static destructors (over half a second at exit, on every
/// rank), its output flushed.
bool joined_a_group();

}  // namespace cli
