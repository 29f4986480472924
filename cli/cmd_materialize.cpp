#include "cmd_materialize.h"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>

#include <spdlog/spdlog.h>

#include "ckpt/error.h"
#include "ckpt/report.h"
#include "ckpt/torch_plugin.h"
#include "common.h"
#include "input_spec.h"
#include "progress.h"

namespace cli {
namespace {

struct materialize_options {
  std::string checkpoint;
  ckpt::materialize_request req;
  bool no_strict = false;
  bool json = false;
  std::vector<std::string> inputs;
  ckpt::open_options reader;
};

void print_list(const char* title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  std::cout << title << " (" << items.size() << "):\n";
  for (size_t i = 0; i < items.size() && i < 20; ++i) std::cout << "  " << items[i] << "\n";
  if (items.size() > 20) std::cout << "  ... " << items.size() - 20 << " more\n";
}

void run_materialize(materialize_options& o) {
  o.req.strict = !o.no_strict;
  for (const auto& s : o.inputs) o.req.run_inputs.push_back(parse_input_spec(s));
  if (!o.req.run_inputs.empty() && o.req.run_method.empty()) o.req.run_method = "forward";
  ckpt::checkpoint c = ckpt::open_checkpoint(o.checkpoint, o.reader);
  o.req.release_input = true;  // c is not used after materialize
  progress_bar bar("materialize");
  if (bar.enabled()) o.req.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  ckpt::materialize_report r;
  try {
    r = ckpt::torch_plugin().materialize(c, o.req);
  } catch (ckpt::error& e) {
    bar.finish();
    e.with_file(o.checkpoint);
    throw;
  }
  bar.finish();
  double gbps = r.seconds > 0 ? double(r.bytes) / r.seconds / 1e9 : 0;

  if (o.json) {
    nlohmann::json doc;
    doc["checkpoint"] = o.checkpoint;
    doc["model"] = o.req.model.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.req.model);
    doc["device"] = r.device;
    doc["tensors"] = r.tensors;
    doc["bytes"] = r.bytes;
    doc["seconds"] = r.seconds;
    doc["gb_per_s"] = gbps;
    doc["key_edit"] = r.key_edit;
    doc["missing"] = r.missing;
    doc["unexpected"] = r.unexpected;
    doc["shape_mismatched"] = r.shape_mismatched;
    doc["dtype_converted"] = r.dtype_converted;
    doc["filled_from_model"] = r.filled_from_model;
    if (o.req.check_finite) doc["non_finite"] = r.non_finite;
    if (!r.run_method.empty()) {
      nlohmann::json outs = nlohmann::json::array();
      for (size_t i = 0; i < r.outputs.size(); ++i) {
        const auto& x = r.outputs[i];
        nlohmann::json j = {{"path", x.path}, {"type", x.type}};
        if (x.is_tensor) {
          j["dtype"] = x.dtype;
          j["shape"] = x.shape;
          j["checksum"] = r.checksums[i];
        } else {
          j["value"] = x.value;
        }
        outs.push_back(j);
      }
      doc["run"] = {{"method", r.run_method}, {"outputs", outs}};
    }
    doc["output"] = o.req.output.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.req.output);
    std::cout << ckpt::json_text(doc) << "\n";
  } else {
    std::cout << "materialized " << r.tensors << " tensors (" << human_bytes(r.bytes) << ") on " << r.device << " in "
              << std::fixed << std::setprecision(3) << r.seconds << " s";
    if (r.bytes) std::cout << " (" << std::setprecision(2) << gbps << " GB/s)";
    std::cout << "\n";
    if (!o.req.model.empty()) std::cout << "key edit: " << r.key_edit << "\n";
    print_list("missing from the checkpoint", r.missing);
    print_list("filled from the model file", r.filled_from_model);
    print_list("not used by the model", r.unexpected);
    print_list("converted", r.dtype_converted);
    if (o.req.check_finite) {
      if (r.non_finite.empty())
        std::cout << "all floating tensors are finite\n";
      else
        print_list("tensors with NaN or Inf", r.non_finite);
    }
    if (!r.run_method.empty()) {
      std::cout << r.run_method << " on " << r.device << " returned:\n";
      for (size_t i = 0; i < r.outputs.size(); ++i) {
        const auto& x = r.outputs[i];
        std::cout << "  " << (x.path.empty() ? "(result)" : x.path) << ": ";
        if (x.is_tensor)
        {
          std::cout << x.dtype << " " << shape_string(x.shape);
          if (std::isnan(r.checksums[i]))
            std::cout << "  (meta: no values)\n";
          else
            std::cout << "  checksum " << std::setprecision(6) << r.checksums[i] << "\n";
        }
        else
          std::cout << x.type << " " << x.value << "\n";
      }
    }
    if (!o.req.output.empty()) std::cout << "wrote " << o.req.output << "\n";
  }
  set_exit_code(o.req.check_finite && !r.non_finite.empty() ? 1 : 0);
}

}  // namespace

void setup_materialize(CLI::App& app) {
  auto o = std::make_shared<materialize_options>();
  CLI::App* cmd = app.add_subcommand(
      "materialize", "Load weights from the file straight onto a device, into empty (never randomly initialized) "
                     "tensors; into a TorchScript model's skeleton with --model");
  cmd->add_option("CKPT", o->checkpoint, "torch.save, TorchScript, safetensors or legacy torch file")->required();
  cmd->add_option("--device", o->req.device, "cpu, cuda, cuda:N, or meta (plan and check, copy nothing)")
      ->capture_default_str();
  cmd->add_option("--model", o->req.model, "TorchScript model to fill (built on meta; its weights are not read)");
  cmd->add_option("--dtype", o->req.dtype, "Cast floating tensors to this type on the device (e.g. bfloat16)");
  auto strict = cmd->add_flag("--strict", "A model tensor missing from CKPT is an error (the default)");
  cmd->add_flag("--no-strict", o->no_strict, "Fill model tensors missing from CKPT from the model file")->excludes(strict);
  cmd->add_option("-o,--output", o->req.output,
                  "Write the result: the TorchScript module with --model, else a torch.save archive");
  cmd->add_option("--run", o->req.run_method, "After loading, call this method (e.g. forward, evaluation_step)");
  cmd->add_option("--input", o->inputs, "An input of --run: SHAPE[:DTYPE], e.g. 4x5:int64 (repeat per argument)");
  cmd->add_flag("--check-finite", o->req.check_finite, "Report floating tensors holding NaN or Inf (exit 1 if any)");
  cmd->add_flag("--mmap", o->req.mmap, "CPU: back the tensors with the mapped file, every page mapped (zero-copy, copy-on-write)");
  cmd->add_option("--threads", o->req.threads, "Reader threads (default: up to 8)");
  cmd->add_flag("--json", o->json, "Print the report as JSON");
  add_reader_flags(*cmd, o->reader);
  cmd->callback([o] { run_materialize(*o); });
}

}  // namespace cli
