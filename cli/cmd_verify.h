#pragma once

#include <CLI/CLI.hpp>

namespace cli {

/// Registers `ckptool verify FILE [--json]`.
void setup_verify(CLI::App& app);

}  // namespace cli
