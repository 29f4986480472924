// materialize CKPT --model EP.pt2 (ckpt/pt2_fill.h, formats.md §14.9): a torch.export
// archive filled with a checkpoint's weights, written as a new archive without LibTorch.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/materialize.h"
#include "ckpt/output_set.h"

namespace cli {

/// The archive at `path` opened as a checkpoint when it is a torch.export archive (format
/// pt2 with a program); nullopt for anything else, which the caller's own open reports.
std::optional<ckpt::checkpoint> open_exported_program(const std::string& path, const ckpt::open_options& reader);

struct pt2_fill_args {
  std::string checkpoint, model, output;
  ckpt::output_file* out = nullptr;  // -o, declared in `set`
  bool strict = true;
  bool json = false;
  std::vector<std::string> programs;  // --program; empty: every program of the archive (--run: at most one)
  /// --run: the filled archive (-o, else a temporary file) run by the LibTorch plugin.
  ckpt::materialize_request run;
};

/// Plans the fill (every refusal before anything is written), writes -o and commits the
/// set, and prints the report. Returns the exit code.
int materialize_exported_program(ckpt::output_set& set, const ckpt::checkpoint& c, const ckpt::checkpoint& ep,
                                 const pt2_fill_args& a, std::ostream& report);

}  // namespace cli
