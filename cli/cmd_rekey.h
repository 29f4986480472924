#pragma once

#include <CLI/CLI.hpp>

namespace cli {

/// Registers `ckptool rekey IN -o OUT [operations] [--dry-run] [--json] [--force]`.
void setup_rekey(CLI::App& app);

}  // namespace cli
