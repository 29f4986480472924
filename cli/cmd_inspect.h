#pragma once

#include <CLI/CLI.hpp>

namespace cli {

/// Registers `ckptool inspect FILE [--json] [--tree] [--filter GLOB] [--input SHAPE[:DTYPE]]...`.
void setup_inspect(CLI::App& app);

}  // namespace cli
