#include "cmd_materialize.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "ckpt/error.h"
#include "ckpt/input_file.h"
#include "ckpt/slice.h"
#include "ckpt/output_set.h"
#include "ckpt/report.h"
#include "base/text_escape.h"
#include "plugin/torch_plugin.h"
#include "ckpt/torchscript_code.h"
#include "aoti_cli.h"
#include "pt2_fill_cli.h"
#include "common.h"
#include "base/text.h"
#include "input_spec.h"
#include "load_guard.h"
#include "progress.h"
#include "validators.h"
#include "sigbus.h"

namespace cli {
namespace {

struct materialize_options {
  std::string checkpoint;
  ckpt::materialize_request req;
  bool no_strict = false;
  bool json = false;
  std::vector<std::string> inputs;
  std::vector<std::string> args;
  std::string output;
  CLI::Option* output_opt = nullptr;
  ckpt::open_options reader;
  code_options code;
  std::string plan;                  // --plan: a JSON file or a preset name
  std::vector<std::string> programs;  // --program: of a torch.export --model
  std::optional<int64_t> rank, world;
  int64_t rank_flag = 0, world_flag = 1;
  CLI::Option* rank_opt = nullptr;
  CLI::Option* world_opt = nullptr;
};

// The rank and world of --plan: the flags, else the launcher's RANK and WORLD_SIZE (torchrun
// and most launchers set both), else a usage error.
int64_t launcher_value(const std::optional<int64_t>& flag, const char* flag_name, const char* env) {
  if (flag) return *flag;
  const char* v = std::getenv(env);
  if (!v || !*v)
    throw ckpt::error(ckpt::errc::usage, std::string("--plan needs ") + flag_name + " (or " + env + " set by a launcher)");
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno || *end || n < 0)
    throw ckpt::error(ckpt::errc::usage, std::string(env) + "='" + v + "' is not a non-negative integer");
  return n;
}

ckpt::slice_selection selection_of(const materialize_options& o) {
  // Each from its flag, else from the launcher: `--plan P` alone under torchrun just works.
  const int64_t rank = launcher_value(o.rank, "--rank", "RANK");
  const int64_t world = launcher_value(o.world, "--world", "WORLD_SIZE");
  if (auto preset = ckpt::slice_preset(o.plan, rank, world)) return *preset;
  return ckpt::parse_slice_plan(ckpt::read_text_input(o.plan), "--plan " + o.plan, rank, world);
}

void print_list(std::ostream& out, const char* title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  out << title << " (" << items.size() << "):\n";
  for (size_t i = 0; i < items.size() && i < 20; ++i) out << "  " << ckpt::display_name(items[i]) << "\n";
  if (items.size() > 20) out << "  ... " << items.size() - 20 << " more\n";
}

int run_materialize(materialize_options& o) {
  // A directory stands for the one model file it holds, or its shard index, or is a DCP checkpoint.
  o.checkpoint = ckpt::resolve_checkpoint_path(o.checkpoint);
  o.req.strict = !o.no_strict;
  if (o.rank_opt->count()) o.rank = o.rank_flag;
  if (o.world_opt->count()) o.world = o.world_flag;
  if (!o.plan.empty()) {
    if (!o.req.model.empty()) throw ckpt::error(ckpt::errc::usage, "--plan cannot be combined with --model");
    o.req.slices = selection_of(o);
    // A rank reads only the DCP chunk archives its slices meet, their ends included.
    o.reader.open_chunk = ckpt::chunks_met_by(*o.req.slices);
  } else if (o.rank || o.world) {
    throw ckpt::error(ckpt::errc::usage, "--rank and --world select a slice of each tensor: they need --plan");
  }
  for (const auto& s : o.inputs) o.req.run_inputs.push_back(parse_input_spec(s));
  for (const auto& s : o.args) o.req.run_args.push_back(parse_arg_spec(s));
  if ((!o.req.run_inputs.empty() || !o.req.run_args.empty()) && o.req.run_method.empty()) o.req.run_method = "forward";
  // Everything read and everything written, declared before anything is read or written.
  ckpt::output_set set;
  ckpt::file_fingerprint in = add_checkpoint_inputs(set, o.checkpoint);
  if (!o.req.model.empty()) set.add_input(o.req.model);
  // The output keeps the checkpoint's permission bits: a private checkpoint stays private.
  if (o.output_opt->count()) {
    if (o.req.device.rfind("meta", 0) == 0)
      throw ckpt::error(ckpt::errc::usage, "-o cannot write meta tensors' data; use a real device");
    o.req.output = &set.add_output(o.output, in.mode & 0777);
  }
  std::ostream& report = set.writes_stdout() ? std::cerr : std::cout;
  // Nothing here reads a torch.export program's graph: its nodes, most of its JSON, are
  // checked as JSON and not built.
  o.reader.read_pt2_graph = false;
  // Timed apart from the load (`seconds`): the benchmark compares open + load with a Python
  // loader's whole call, whose own clock starts before it opens the file.
  const auto open_start = std::chrono::steady_clock::now();
  ckpt::checkpoint c = ckpt::open_checkpoint(o.checkpoint, o.reader);
  const double open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - open_start).count();
  // An AOTInductor package (formats.md §15.5): every key is paired with a constant and
  // checked against the package's table here, before LibTorch is loaded.
  std::optional<aoti_opened> package;
  ckpt::aoti::swap_plan plan;
  const bool aoti = !o.req.model.empty() && is_aoti_package_file(o.req.model);
  // A torch.export archive (formats.md §14.9): filled and written without LibTorch.
  if (!o.req.model.empty() && !aoti)
    if (std::optional<ckpt::checkpoint> ep = open_exported_program(o.req.model, o.reader)) {
      pt2_fill_args a;
      a.checkpoint = o.checkpoint;
      a.model = o.req.model;
      a.output = o.output;
      a.out = o.req.output;
      a.strict = o.req.strict;
      a.json = o.json;
      a.programs = o.programs;
      a.run = o.req;
      a.run.output = nullptr;
      return materialize_exported_program(set, c, *ep, a, report);
    }
  if (!o.programs.empty())
    throw ckpt::error(ckpt::errc::usage, "--program selects programs of a torch.export --model archive");
  if (aoti) {
    package.emplace(open_aoti_package(o.req.model));
    const ckpt::aoti::model& m = ckpt::aoti::pick_model(package->package, "");
    try {
      plan = ckpt::aoti::plan_swap(c, m, o.req.strict);
    } catch (ckpt::error& e) {
      e.with_file(o.checkpoint);
      throw;
    }
    o.req.aoti_model = &m;
    o.req.aoti_plan = &plan;
  }
  if (!o.req.model.empty() && !o.code.allow_code && !package) {
    // Refused from ckptool's own reading of code/, before LibTorch is loaded (a quarter of
    // a second) or sees the file, as inspect and rekey --match do.
    ckpt::checkpoint model = ckpt::open_checkpoint(o.req.model, o.reader);
    for (const auto& f : model.files) {
      if (!f.zip) continue;
      try {
        ckpt::refuse_load_time_code(*f.zip);
      } catch (ckpt::error& e) {
        e.with_file(o.req.model);
        throw;
      }
    }
  }
  o.req.release_input = true;  // c is not used after materialize
  set.open();
  progress_bar bar("materialize");
  if (bar.enabled()) o.req.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  ckpt::materialize_report r;
  try {
    const ckpt::torch_plugin_api& plugin = ckpt::torch_plugin();
    exit_on_sigbus(o.checkpoint);  // the checkpoint is mapped (--mmap, and the CPU loader's page filler)
    std::optional<load_guard> guard;
    if (!o.req.model.empty() && !package) guard.emplace(o.req.model, o.code.load_timeout);
    o.req.allow_code = o.code.allow_code;
    o.req.model_built = [&guard] {
      if (guard) guard->disarm();
    };
    r = plugin.materialize(c, o.req);
  } catch (ckpt::error& e) {
    bar.finish();
    e.with_file(o.checkpoint);
    throw;
  }
  bar.finish();
  // Committed last, and only when written (--check-finite that fails writes nothing); the
  // inputs must not have changed while they were read either way.
  if (o.req.output && !r.output_written)
    set.check_inputs_unchanged();
  else
    set.commit();
  double gbps = r.seconds > 0 ? double(r.bytes) / r.seconds / 1e9 : 0;

  if (o.json) {
    nlohmann::json doc;
    doc["checkpoint"] = o.checkpoint;
    doc["model"] = o.req.model.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.req.model);
    doc["device"] = r.device;
    doc["tensors"] = r.tensors;
    doc["bytes"] = r.bytes;
    doc["open_seconds"] = open_seconds;
    doc["seconds"] = r.seconds;
    doc["gb_per_s"] = gbps;
    doc["key_edit"] = r.key_edit;
    doc["missing"] = r.missing;
    doc["unexpected"] = r.unexpected;
    doc["shape_mismatched"] = r.shape_mismatched;
    doc["dtype_converted"] = r.dtype_converted;
    doc["filled_from_model"] = r.filled_from_model;
    doc["from_model_file"] = r.from_model_file;
    if (o.req.check_finite) doc["non_finite"] = r.non_finite;
    if (r.slices) {
      const ckpt::slice_load_report& sr = *r.slices;
      doc["slices"] = {{"rank", o.req.slices->rank},         {"world", o.req.slices->world},
                       {"sliced", sr.sliced},                {"replicated", sr.whole},
                       {"left_out", sr.left_out},            {"slice_bytes", sr.slice_bytes},
                       {"full_bytes", sr.full_bytes}};
      doc["io"] = {{"bytes_read", sr.bytes_read}};
    }
    if (!r.run_method.empty()) {
      doc["run"] = {{"method", r.run_method}, {"outputs", run_outputs_json(r)}};
    }
    doc["output"] = r.output_written ? nlohmann::json(o.output) : nlohmann::json(nullptr);
    report << ckpt::json_text(doc) << "\n";
  } else {
    report << "materialized " << r.tensors << " tensors (" << human_bytes(r.bytes) << ") on " << r.device << " in "
              << std::fixed << std::setprecision(3) << r.seconds << " s";
    if (r.bytes) report << " (" << std::setprecision(2) << gbps << " GB/s)";
    report << "\n";
    if (r.slices) {
      const ckpt::slice_load_report& sr = *r.slices;
      report << "rank " << o.req.slices->rank << " of " << o.req.slices->world << ": " << sr.sliced << " sliced, "
             << sr.whole << " replicated, " << sr.left_out << " left out (no rule matched); read "
             << human_bytes(sr.bytes_read) << " for " << human_bytes(sr.slice_bytes) << " of slices ("
             << human_bytes(sr.full_bytes) << " whole)\n";
    }
    if (!o.req.model.empty()) report << "key edit: " << ckpt::escape_controls(r.key_edit) << "\n";
    print_list(report, "missing from the checkpoint", r.missing);
    print_list(report, "filled from the model file", r.filled_from_model);
    print_list(report, "from the model file (attributes and constants no state dict holds)", r.from_model_file);
    print_list(report, "not used by the model", r.unexpected);
    print_list(report, "converted", r.dtype_converted);
    if (o.req.check_finite) {
      if (r.non_finite.empty())
        report << "all floating tensors are finite\n";
      else
        print_list(report, "tensors with NaN or Inf", r.non_finite);
    }
    if (!r.run_method.empty()) {
      report << ckpt::escape_controls(r.run_method) << " on " << r.device << " returned:\n";
      for (size_t i = 0; i < r.outputs.size(); ++i) {
        const auto& x = r.outputs[i];
        report << "  " << (x.path.empty() ? "(result)" : ckpt::display_name(x.path)) << ": ";
        if (x.is_tensor)
        {
          report << ckpt::escape_controls(x.dtype) << " " << ckpt::text::shape(x.shape);
          if (std::isnan(r.checksums[i]))
            report << "  (meta: no values)\n";
          else
            report << "  checksum " << std::setprecision(6) << r.checksums[i] << "\n";
        }
        else
          report << ckpt::escape_controls(x.type) << " " << ckpt::escape_controls(x.value) << "\n";
      }
    }
    if (r.output_written)
      report << "wrote " << ckpt::display_name(o.output) << "\n";
    else if (o.req.output)
      report << "not written: " << ckpt::display_name(o.output) << " (--check-finite found NaN or Inf)\n";
  }
  return o.req.check_finite && !r.non_finite.empty() ? ckpt::exit_code(ckpt::errc::check_failed) : 0;
}

}  // namespace

nlohmann::json run_outputs_json(const ckpt::materialize_report& r) {
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
  return outs;
}

verb setup_materialize(CLI::App& app) {
  auto o = std::make_shared<materialize_options>();
  CLI::App* cmd = app.add_subcommand(
      "materialize", "Load weights from the file straight onto a device, into empty (never randomly initialized) "
                     "tensors; into a TorchScript model's skeleton, an AOTInductor package or a torch.export "
                     "archive with --model");
  cmd->add_option("CKPT", o->checkpoint, "torch.save, TorchScript, safetensors or legacy torch file")->required();
  cmd->add_option("--device", o->req.device, "cpu, cuda, cuda:N, or meta (plan and check, copy nothing)")
      ->capture_default_str()->check(device_name());
  cmd->add_option("--model", o->req.model, "TorchScript model to fill (built on meta; its weights are not read), AOTInductor package, "
                  "or torch.export archive (.pt2; -o writes it filled)")
      ->check(non_empty_path());
  cmd->add_option("--program", o->programs,
                  "With a torch.export --model holding several programs: fill this one (repeatable; default: every "
                  "program, each aligned to CKPT on its own); the others are copied as they are. With --run: the "
                  "one program filled and run, needed when the archive holds several");
  cmd->add_option("--dtype", o->req.dtype, "Cast floating tensors to this type on the device (e.g. bfloat16)")
      ->check(floating_dtype());
  auto strict = cmd->add_flag("--strict", "A model tensor missing from CKPT is an error (the default)");
  cmd->add_flag("--no-strict", o->no_strict, "Fill model tensors missing from CKPT from the model file")->excludes(strict);
  o->output_opt = cmd->add_option("-o,--output", o->output,
                                  "Write the result: the TorchScript module or filled .pt2 with --model, else a torch.save archive; "
                                  "'-' for standard output")
                      ->check(non_empty_path());
  cmd->add_option("--run", o->req.run_method, "After loading, call this method (e.g. forward, evaluation_step)");
  cmd->add_option("--input", o->inputs, "An input of --run: SHAPE[:DTYPE], e.g. 4x5:int64 (repeat per argument)");
  cmd->add_option("--arg", o->args,
                  "A non-tensor argument of --run (int, float, bool, str, None, List[int]): VALUE in order after "
                  "the --input tensors, or NAME=VALUE")
      ->type_name("[NAME=]VALUE");
  cmd->add_flag("--check-finite", o->req.check_finite, "Report floating tensors holding NaN or Inf (exit 1 if any)");
  cmd->add_flag("--mmap", o->req.mmap, "CPU: back the tensors with the mapped file, every page mapped (zero-copy, copy-on-write)");
  cmd->add_option("--threads", o->req.threads, "Reader threads, 1 to 256 (default: up to 8)")->check(thread_count());
  cmd->add_option("--plan", o->plan,
                  "Load only this rank's slice of each tensor: a JSON file {\"GLOB\": \"Shard(D)|Replicate()|"
                  "Range(D,START,LEN)\"} (first match wins; unmatched keys are left out), or llama-tp")
      ->check(non_empty_path());
  o->rank_opt = cmd->add_option("--rank", o->rank_flag, "With --plan: this process's rank (default: $RANK)")
                     ->check(cli::integer_in(0, INT32_MAX - 1));
  o->world_opt = cmd->add_option("--world", o->world_flag, "With --plan: the number of ranks (default: $WORLD_SIZE)")
                      ->check(cli::integer_in(1, INT32_MAX));  // torch's world size is a C int
  cmd->add_flag("--json", o->json, "Print the report as JSON");
  add_reader_flags(*cmd, o->reader);
  add_code_flags(*cmd, o->code);
  return {cmd, [o] { return run_materialize(*o); }};
}

}  // namespace cli
