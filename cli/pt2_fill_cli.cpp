#include "pt2_fill_cli.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>

#include <nlohmann/json.hpp>

#include "base/text.h"
#include "base/text_escape.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "ckpt/pt2_fill.h"
#include "ckpt/report.h"
#include "aoti_cli.h"
#include "cmd_materialize.h"
#include "common.h"
#include "io/temp_registry.h"
#include "plugin/torch_plugin.h"

namespace cli {
namespace {

void print_list(std::ostream& out, const char* title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  out << title << " (" << items.size() << "):\n";
  for (size_t i = 0; i < items.size() && i < 20; ++i) out << "  " << ckpt::display_name(items[i]) << "\n";
  if (items.size() > 20) out << "  ... " << items.size() - 20 << " more\n";
}

// The filled archive --run needs on disk when -o names none (or a stream): removed on
// every way out of the command.
class temporary_archive {
 public:
  temporary_archive() {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/ckptool-filled-XXXXXX.pt2";
    fd_ = ::mkstemps(path_.data(), 4);
    if (fd_ < 0) throw ckpt::error(ckpt::errc::io, "cannot create a temporary file for --run").with_file(path_);
    slot_ = ckpt::temp_registry::hold(path_.c_str());  // a signal's handler removes it too
  }
  ~temporary_archive() {
    ::close(fd_);
    ::unlink(path_.c_str());
    if (slot_ >= 0) ckpt::temp_registry::release(slot_);
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int slot_ = -1;
};

// The flags that mean something else here, refused before anything is read or written.
void check_flags(const ckpt::materialize_request& req) {
  if (!req.run_method.empty()) {
    // Checked before anything is written (the run comes after -o is committed).
    if (req.run_method != "forward")
      throw ckpt::error(ckpt::errc::usage, "--run " + req.run_method + ": an exported program has one entry point, forward");
    if (!req.run_args.empty()) throw ckpt::error(ckpt::errc::usage, "--arg does not apply to a torch.export --model");
    if (req.device != "cpu")
      throw ckpt::error(ckpt::errc::unsupported, "--run with a torch.export archive runs on the CPU only (LibTorch's "
                                                 "ExportedProgram runner, nativert, takes no device); --device " +
                                                     req.device);
  }
  if (req.dtype.size() || req.mmap || req.check_finite)
    throw ckpt::error(ckpt::errc::usage, "--dtype, --mmap and --check-finite do not apply to a torch.export --model: "
                                         "its weights are written with the archive's own dtypes");
}

}  // namespace

std::optional<ckpt::checkpoint> open_exported_program(const std::string& path, const ckpt::open_options& reader) {
  // Looked at cheaply first: every other --model (TorchScript) is opened by its own path.
  if (!is_pt2_archive_file(path)) return std::nullopt;
  ckpt::checkpoint ep = ckpt::open_checkpoint(path, reader);
  if (ep.format != ckpt::file_format::pt2 || !ep.pt2) return std::nullopt;
  return ep;
}

int materialize_exported_program(ckpt::output_set& set, const ckpt::checkpoint& c, const ckpt::checkpoint& ep,
                                 const pt2_fill_args& a, std::ostream& report) {
  check_flags(a.run);
  // The program --run runs, settled before anything is written: nativert runs one program
  // of the archive, by name (formats.md §14.9).
  std::string run_program;
  if (!a.run.run_method.empty()) run_program = ckpt::pt2::program_to_run(ep, a.programs);
  const auto start = std::chrono::steady_clock::now();
  ckpt::pt2::fill_plan plan;
  try {
    plan = ckpt::pt2::plan_fill(c, ep, a.strict, a.programs);
  } catch (ckpt::error& e) {
    e.with_file(a.checkpoint);
    throw;
  }
  set.open();
  if (a.out) {
    try {
      ckpt::pt2::write_filled(c, ep, plan, a.out->fd());
    } catch (ckpt::error& e) {
      e.with_file(a.out->path());
      throw;
    }
    set.commit();
  } else {
    set.check_inputs_unchanged();
  }
  // --run loads the written archive, as torch.export.load would, in LibTorch's runtime.
  ckpt::materialize_report run;
  if (!a.run.run_method.empty()) {
    std::optional<temporary_archive> temp;
    ckpt::materialize_request req = a.run;
    req.program = run_program;
    if (a.out && !a.out->is_stream()) {
      req.model = a.output;
    } else {
      temp.emplace();
      ckpt::pt2::write_filled(c, ep, plan, temp->fd());
      req.model = temp->path();
    }
    ckpt::checkpoint unused;
    run = ckpt::torch_plugin().materialize(unused, req);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (a.json) {
    nlohmann::json doc;
    doc["checkpoint"] = a.checkpoint;
    doc["model"] = a.model;
    doc["device"] = "cpu";
    doc["programs"] = plan.programs;
    doc["tensors"] = plan.filled.size();
    doc["bytes"] = plan.bytes;
    doc["seconds"] = seconds;
    doc["key_edit"] = plan.key_edit;
    nlohmann::json filled = nlohmann::json::object();
    for (const auto& [fqn, key] : plan.filled) filled[fqn] = key;
    doc["filled"] = filled;
    doc["missing"] = plan.kept;
    doc["filled_from_model"] = plan.kept;
    doc["from_model_file"] = plan.from_archive;
    doc["unexpected"] = plan.unexpected;
    doc["meta_export"] = plan.meta_export;
    if (!run.run_method.empty()) {
      doc["run"] = {{"method", run.run_method},
                    {"program", run.run_program},
                    {"runtime", "nativert"},
                    {"outputs", run_outputs_json(run)}};
    }
    doc["output"] = a.out ? nlohmann::json(a.output) : nlohmann::json(nullptr);
    report << ckpt::json_text(doc) << "\n";
  } else {
    report << "filled " << plan.filled.size() << " tensors of " << ckpt::display_name(a.model) << " ("
           << human_bytes(plan.bytes) << ") in " << std::fixed << std::setprecision(3) << seconds << " s"
           << (plan.meta_export ? " (an archive exported on the meta device: new weight files)" : "") << "\n";
    if (ep.pt2 && ep.pt2->models.size() > 1) {
      report << "programs filled:";
      for (const std::string& p : plan.programs) report << " " << ckpt::escape_controls(p);
      report << " (of " << ep.pt2->models.size() << ")\n";
    }
    report << "key edit: " << ckpt::escape_controls(plan.key_edit) << "\n";
    print_list(report, "kept from the archive (not in the checkpoint, --no-strict)", plan.kept);
    print_list(report, "from the archive (constants and entries no state dict holds)", plan.from_archive);
    print_list(report, "not used by the archive", plan.unexpected);
    if (!run.run_method.empty()) {
      report << ckpt::escape_controls(run.run_method);
      if (ep.pt2 && ep.pt2->models.size() > 1) report << " of program " << ckpt::escape_controls(run.run_program);
      report << " on cpu (nativert) returned:\n";
      for (size_t i = 0; i < run.outputs.size(); ++i) {
        const auto& x = run.outputs[i];
        report << "  " << (x.path.empty() ? "(result)" : ckpt::display_name(x.path)) << ": ";
        if (x.is_tensor)
          report << ckpt::escape_controls(x.dtype) << " " << ckpt::text::shape(x.shape) << "  checksum "
                 << std::setprecision(6) << run.checksums[i] << "\n";
        else
          report << ckpt::escape_controls(x.type) << " " << ckpt::escape_controls(x.value) << "\n";
      }
    }
    if (a.out) report << "wrote " << ckpt::display_name(a.output) << "\n";
  }
  return 0;
}

}  // namespace cli
