#pragma once

#include <CLI/CLI.hpp>

#include "common.h"

namespace cli {

/// Registers `ckptool inspect FILE [--json] [--tree] [--filter GLOB] [--input SHAPE[:DTYPE]]...`.
verb setup_inspect(CLI::App& app);

}  // namespace cli
