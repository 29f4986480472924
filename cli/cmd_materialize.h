#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ckpt/materialize.h"
#include "common.h"

namespace cli {

/// `--run`'s outputs as `--json` lists them (a row per leaf: tensors with dtype, shape and
/// checksum, other values as text), whichever runtime ran the method.
nlohmann::json run_outputs_json(const ckpt::materialize_report& r);

/// Registers `ckptool materialize CKPT --device DEV [--model MODEL] ...`.
verb setup_materialize(CLI::App& app);

}  // namespace cli
