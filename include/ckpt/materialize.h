// `ckptool materialize` as plain structs, so the CLI can drive it through the LibTorch
// plugin (src/plugin/torch_plugin.h) without including LibTorch. Embedders use ckpt/load.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/slice.h"
#include "ckpt/torchscript.h"

namespace ckpt {

class output_file;  // ckpt/output_set.h
namespace aoti {
struct model;      // ckpt/aoti.h
struct swap_plan;
}  // namespace aoti

struct materialize_request {
  std::string device = "cpu";            // cpu, cuda, cuda:N, meta
  std::string model;                     // TorchScript model to fill; empty: just the tensors
  std::string dtype;                     // cast floating tensors; empty: keep
  bool strict = true;
  bool mmap = false;
  int threads = 0;
  // -o: TorchScript (with model) or torch.save archive, into an open output of the
  // caller's output_set (the caller commits it); null for none.
  output_file* output = nullptr;
  std::string run_method;                // --run
  std::vector<input_spec> run_inputs;
  std::vector<arg_spec> run_args;        // --arg: non-tensor arguments of --run
  /// --run with `model` a torch.export archive (formats.md §14.9): the program to run, the
  /// archive's models/<program>.json. Empty: the archive's only program, whatever its name;
  /// an archive of several then is a usage error naming them, as is a name it lacks.
  std::string program;
  bool check_finite = false;              // refused on meta: meta tensors have no values
  bool allow_code = false;               // --model whose file runs code on load (load.h)
  std::function<void()> model_built;     // see load_options::model_built
  std::function<void(uint64_t, uint64_t)> progress;
  /// The caller is done with the checkpoint: without --model, its pickle tree is freed once
  /// the tensors are named (release_pickle), which for a million tensors halves the peak.
  bool release_input = false;
  /// --rank/--world/--plan: only this rank's slices of the tensors the plan matches
  /// (load_tensors with a selection); not with a model.
  std::optional<slice_selection> slices;
  /// --model naming an AOTInductor package: the model read from it (ckpt/aoti.h) and the
  /// checked plan of which checkpoint keys replace which constants. `model` is then the
  /// package's path. Loading the package runs its native code (formats.md §15.5).
  const aoti::model* aoti_model = nullptr;
  const aoti::swap_plan* aoti_plan = nullptr;
};

struct materialize_report {
  std::string device;
  bool cuda_build = false;
  size_t tensors = 0;
  size_t storages = 0;
  uint64_t bytes = 0;                    // bytes copied from the file
  double seconds = 0;                    // file -> device, synchronized
  std::string key_edit;
  std::vector<std::string> missing, unexpected, shape_mismatched, dtype_converted, filled_from_model;
  std::vector<std::string> from_model_file;  // --model: attributes and constants (module_load_report)
  std::vector<std::string> non_finite;   // --check-finite: tensors with NaN or Inf
  std::vector<meta_output> outputs;      // --run: output shapes (path, dtype, shape)
  std::vector<double> checksums;         // --run: sum of each tensor output, as float64
  std::string run_method;
  std::string run_program;               // --run of a torch.export archive: the program run
  bool output_written = false;           // false when --check-finite found NaN or Inf
  std::optional<slice_load_report> slices;  // with request.slices
};

/// Throws ckpt::error: device (exit 4) for an unavailable device; check_failed (exit 1)
/// for missing keys in strict mode and shape mismatches; the reader's errors otherwise.
/// With check_finite, an output is written only when every floating tensor is finite.
/// `c` is only changed by request.release_input.
materialize_report materialize(checkpoint& c, const materialize_request& request);

}  // namespace ckpt
