#pragma once

#include <CLI/CLI.hpp>

#include "common.h"

namespace cli {

/// Registers `ckptool materialize CKPT --device DEV [--model MODEL] ...`.
verb setup_materialize(CLI::App& app);

}  // namespace cli
