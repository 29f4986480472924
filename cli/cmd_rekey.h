#pragma once

#include <CLI/CLI.hpp>

#include "common.h"

namespace cli {

/// Registers `ckptool rekey IN -o OUT [operations] [--dry-run] [--json] [--force]`.
verb setup_rekey(CLI::App& app);

}  // namespace cli
