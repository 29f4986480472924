#pragma once

#include <CLI/CLI.hpp>

namespace cli {

/// Registers `ckptool materialize CKPT --device DEV [--model MODEL] ...`.
void setup_materialize(CLI::App& app);

}  // namespace cli
