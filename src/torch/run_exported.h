// Internal: materialize --run for a torch.export archive (formats.md §14.9), through
// LibTorch's own ExportedProgram runtime, nativert's ModelRunnerHandle.
#pragma once

#include <string>

#include "ckpt/materialize.h"

namespace ckpt::detail {

/// True when `path` is a torch.export archive with a program (what --run hands nativert).
bool is_exported_program(const std::string& path);

/// Runs request.run_method ("forward" only: an ExportedProgram has one entry point) of
/// program request.program (empty: the only one; pt2::program_to_run) of the archive at
/// request.model with request.run_inputs, on the CPU (ModelRunnerHandle takes
/// no device: the weights go where the archive's configs say). Fills the report's outputs
/// and checksums as TorchScript's --run does.
materialize_report run_exported(const materialize_request& request);

}  // namespace ckpt::detail
