#include "cmd_verify.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/output_set.h"
#include "ckpt/report.h"
#include "base/text_escape.h"
#include "ckpt/verify.h"
#include "aoti_cli.h"
#include "common.h"
#include "distributed.h"
#include "progress.h"

namespace cli {
namespace {

struct verify_options {
  std::string file;
  bool json = false;
  ckpt::open_options reader;
  distributed_flags dist;
};

int run_verify(const verify_options& given) {
  // Under torchrun the ranks share the data (docs/distributed.md); rank 0 reports.
  const std::unique_ptr<ckpt::process_group> group = open_process_group(given.dist);
  verify_options o = given;
  ckpt::output_set inputs;  // no outputs: it refuses a FIFO and sees the file change
  ckpt::run_collectively(*group, "verify/inputs", [&] {
    // A directory stands for the one model file it holds, or its shard index, or is a DCP checkpoint.
    o.file = ckpt::resolve_checkpoint_path(given.file);
    std::vector<std::string> files{o.file};
    try {
      files = ckpt::checkpoint_input_files(o.file);
    } catch (const ckpt::error& e) {
      // A broken index is a failed check, which verify_file reports; anything else is not.
      if (e.kind() == ckpt::errc::io || e.kind() == ckpt::errc::usage || e.kind() == ckpt::errc::unsupported) throw;
    }
    for (const std::string& f : files) inputs.add_input(f);
    // An AOTInductor package is one small file of metadata: nothing to divide among ranks.
    if (group->world() > 1 && is_aoti_package_file(o.file))
      throw ckpt::error(ckpt::errc::usage, "verify of an AOTInductor package runs in one process, not under a launcher");
  });
  // AOTInductor packages (formats.md §15): checked here until pt2 detection joins the generic open.
  if (is_aoti_package_file(o.file)) {
    int rc = verify_aoti(o.file, o.json);
    inputs.check_inputs_unchanged();
    return rc;
  }
  progress_bar bar("verify");
  // An OK for bytes that changed under the check would be an OK for no file at all.
  ckpt::verify_report r = ckpt::verify_file(
      o.file, o.reader, *group, [&bar](uint64_t d, uint64_t t) { bar.update(d, t); },
      [&inputs] { inputs.check_inputs_unchanged(); });
  bar.finish();
  const int status = r.ok() ? 0 : ckpt::exit_code(ckpt::errc::check_failed);
  if (group->rank() != 0) return status;
  if (o.json) {
    nlohmann::json doc = {{"file", o.file},
                          {"ok", r.ok()},
                          {"format", r.format.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.format)},
                          {"layout", r.layout.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.layout)},
                          {"files", r.files},
                          {"tensors", r.tensors},
                          {"records_checked", r.records_checked},
                          {"records_without_crc", r.records_without_crc},
                          {"bytes_checked", r.bytes_checked},
                          {"problems", r.problems},
                          {"notes", r.notes},
                          {"unsafe_globals", r.unsafe_globals}};
    std::cout << ckpt::json_text(doc) << "\n";
  } else {
    std::cout << ckpt::display_name(o.file) << ": " << (r.ok() ? "OK" : "FAILED");
    if (!r.format.empty())
      std::cout << " (" << ckpt::escape_controls(r.format)
                << (r.files > 1 ? ", " + r.layout + " of " + std::to_string(r.files) + " files" : std::string()) << ", "
                << r.tensors << " tensors, " << r.records_checked << " records' CRC checked, "
                << human_bytes(r.bytes_checked) << ")";
    std::cout << "\n";
    for (const auto& p : r.problems) std::cout << "  problem: " << ckpt::escape_controls(p) << "\n";
    for (const auto& n : r.notes) std::cout << "  note: " << ckpt::escape_controls(n) << "\n";
  }
  return status;
}

}  // namespace

verb setup_verify(CLI::App& app) {
  auto o = std::make_shared<verify_options>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check a checkpoint: every zip record's CRC-32, every tensor view against its storage, every "
                "safetensors range, and unsafe globals (exit 0 if all is well, 1 if not)");
  cmd->add_option("FILE", o->file, "torch.save, TorchScript, safetensors or legacy torch file, or a torch.distributed.checkpoint directory")->required();
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  add_reader_flags(*cmd, o->reader);
  add_distributed_flags(*cmd, o->dist);
  return {cmd, [o] { return run_verify(*o); }};
}

}  // namespace cli
