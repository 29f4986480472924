#pragma once

#include <CLI/CLI.hpp>

#include "common.h"

namespace cli {

/// Registers `ckptool diff A B [--atol X] [--rtol X] [--equal-nan] [--metadata-only] [--json]`.
verb setup_diff(CLI::App& app);

}  // namespace cli
