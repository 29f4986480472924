#pragma once

#include <CLI/CLI.hpp>

#include "common.h"

namespace cli {

/// Registers `ckptool convert IN -o OUT --to torch|safetensors|hf [key edits] [--select GLOB]
/// [--state-dict PATH] [--drop-other] [--max-shard-size SIZE] [--json] [--force]`.
verb setup_convert(CLI::App& app);

}  // namespace cli
