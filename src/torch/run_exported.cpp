#include "torch/run_exported.h"

#include <chrono>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/nativert/ModelRunnerHandle.h>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "ckpt/pt2_fill.h"
#include "torch/aten_types.h"
#include "torch/run_outputs.h"
#include "torch/torch_message.h"

namespace ckpt::detail {

bool is_exported_program(const std::string& path) {
  try {
    checkpoint c = open_checkpoint(path);
    return c.format == file_format::pt2 && c.pt2;
  } catch (const error&) {
    return false;
  }
}

materialize_report run_exported(const materialize_request& req) {
  if (req.device != "cpu")
    throw error(errc::unsupported, "--run with a torch.export archive runs on the CPU only (LibTorch's ExportedProgram "
                                   "runner, nativert, takes no device); --device " + req.device);
  if (req.run_method != "forward")
    throw error(errc::usage, "--run " + req.run_method + ": an exported program has one entry point, forward");
  if (!req.run_args.empty()) throw error(errc::usage, "--arg is not supported with a torch.export archive");
  // Chosen before LibTorch sees the file: nativert names a missing program only by its
  // record ("models/x.json not found in package").
  const std::string program =
      pt2::program_to_run(open_checkpoint(req.model), req.program.empty() ? std::vector<std::string>{}
                                                                          : std::vector<std::string>{req.program});
  materialize_report r;
  r.device = "cpu";
  std::vector<c10::IValue> inputs;
  // The same deterministic inputs as TorchScript's --run: floats from a generator seeded 0,
  // integers zero.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  for (const auto& in : req.run_inputs) {
    c10::ScalarType st = scalar_type(in.type);
    inputs.push_back(at::isFloatingType(st) ? at::randn(in.shape, gen, at::TensorOptions().dtype(at::kFloat)).to(st)
                                            : at::zeros(in.shape, at::TensorOptions().dtype(st)));
  }
  const auto t0 = std::chrono::steady_clock::now();
  c10::IValue out;
  try {
    at::NoGradGuard no_grad;
    // The name picks models/<program>.json and the program's two payload configs
    // (formats.md §14.9); torch.export.save's "model" is only the usual name.
    torch::nativert::ModelRunnerHandle runner(req.model, program);
    out = runner.run(inputs, {});
  } catch (const c10::Error& e) {
    throw error(errc::usage, "--run forward failed (nativert): " + condense_torch_message(e.what_without_backtrace()))
        .with_file(req.model);
  } catch (const std::exception& e) {
    throw error(errc::usage, "--run forward failed (nativert): " + condense_torch_message(e.what())).with_file(req.model);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.run_method = req.run_method;
  r.run_program = program;
  record_outputs(out, "", r);
  return r;
}

}  // namespace ckpt::detail
