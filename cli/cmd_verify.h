#pragma once

#include <CLI/CLI.hpp>

#include "common.h"

namespace cli {

/// Registers `ckptool verify FILE [--json]`.
verb setup_verify(CLI::App& app);

}  // namespace cli
