#include "cmd_convert.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <thread>

#include <spdlog/spdlog.h>

#include "base/text_escape.h"
#include "ckpt/convert.h"
#include "ckpt/error.h"
#include "ckpt/output_dir.h"
#include "ckpt/output_set.h"
#include "ckpt/parallel_convert.h"
#include "ckpt/input_file.h"
#include "ckpt/report.h"
#include "ckpt/slice.h"
#include "common.h"
#include "distributed.h"
#include "formats/hf_shard_plan.h"
#include "key_edits.h"
#include "load_guard.h"
#include "plugin/torch_plugin.h"
#include "progress.h"
#include "validators.h"

namespace cli {
namespace {

struct convert_options {
  std::string input, output, to, max_shard_size, state_dict, dtype;
  uint32_t ranks = 0;  // 0: not given
  std::string plan;    // --plan: a JSON file or a preset name
  std::vector<std::string> select;
  bool drop_other = false, json = false, force = false;
  ckpt::open_options reader;
  code_options code;
  key_edit_flags edits;
  distributed_flags dist;
};

ckpt::convert_request make_request(const convert_options& o) {
  ckpt::convert_request req;
  const auto target = ckpt::convert_target_named(o.to);
  if (!target) throw ckpt::error(ckpt::errc::usage, "--to must be torch, safetensors, hf or dcp, not '" + o.to + "'");
  req.to = *target;
  if (o.ranks) {
    if (req.to != ckpt::convert_target::dcp) throw ckpt::error(ckpt::errc::usage, "--ranks applies to --to dcp only");
    req.ranks = o.ranks;
  }
  if (!o.plan.empty()) {
    if (req.to != ckpt::convert_target::dcp)
      throw ckpt::error(ckpt::errc::usage, "--plan applies to --to dcp only (materialize --plan loads one rank's slices)");
    // The placements of a 1-D mesh of req.ranks (formats.md §9.9); the rank is not used.
    std::optional<ckpt::slice_selection> sel = ckpt::slice_preset(o.plan, 0, req.ranks);
    if (!sel) sel = ckpt::parse_slice_plan(ckpt::read_text_input(o.plan), "--plan " + o.plan, 0, req.ranks);
    for (const auto& [glob, p] : sel->rules)
      if (p.type == ckpt::placement::kind::range)
        throw ckpt::error(ckpt::errc::usage, "--plan " + o.plan + " '" + glob + "': " + ckpt::placement_text(p) +
                                                 " is not a DTensor placement: --to dcp takes Shard(D) and "
                                                 "Replicate() only");
    req.placements = std::move(sel);
  }
  if (!o.max_shard_size.empty()) {
    if (req.to != ckpt::convert_target::hf)
      throw ckpt::error(ckpt::errc::usage, "--max-shard-size applies to --to hf only");
    // Digits alone are bytes, as the Hub takes an int; anything else is its string form.
    const bool digits = o.max_shard_size.find_first_not_of("0123456789") == std::string::npos;
    req.max_shard_size = digits && o.max_shard_size.size() <= 19 ? std::stoull(o.max_shard_size)
                                                                  : ckpt::hf::parse_max_shard_size(o.max_shard_size);
  }
  if (!o.dtype.empty()) {
    const auto type = ckpt::dtype_from_name(o.dtype);
    if (!type || !ckpt::info(*type).is_floating)
      throw ckpt::error(ckpt::errc::usage, "--dtype must be a floating dtype (float16, bfloat16, float32, ...), not '" +
                                               o.dtype + "'");
    req.cast_to = *type;
    // LibTorch rounds: the plugin is loaded for a cast only.
    req.cast = [](const void* src, ckpt::dtype from, void* dst, ckpt::dtype to, uint64_t count) {
      ckpt::torch_plugin().cast_values(src, from, dst, to, count);
    };
  }
  req.select = o.select;
  if (!o.state_dict.empty()) {
    // Checked for empty elements here; which dict it names is resolved once IN is open.
    if (o.state_dict.front() == '/' || o.state_dict.back() == '/' || o.state_dict.find("//") != std::string::npos)
      throw ckpt::error(ckpt::errc::usage, "--state-dict '" + o.state_dict + "': an empty path element");
  }
  req.drop_other = o.drop_other;
  return req;
}

// What opening the input found worth saying (a shard index's cross-check: a key the index
// omits, a wrong total_size), as inspect says it: converted, but not without a word.
void warn_input(const ckpt::checkpoint& c) {
  for (const auto& w : c.warnings) spdlog::warn("{}: {}", ckpt::escape_controls(c.path), ckpt::escape_controls(w));
}

void report(const convert_options& o, const ckpt::convert_request& req, const ckpt::convert_plan& plan,
            const ckpt::convert_result& r, std::ostream& out) {
  for (const auto& op : plan.keys.unused_ops) spdlog::warn("{} changed no key (a typo?)", ckpt::escape_controls(op));
  for (const auto& [alias, kept] : plan.ties)
    spdlog::warn("{} is tied to {}: written once, as {} (the alias is recorded in __metadata__)",
                 ckpt::display_name(alias), ckpt::display_name(kept), ckpt::display_name(kept));
  for (const auto& d : plan.dropped) spdlog::warn("left out {}", ckpt::display_name(d));
  if (o.json) {
    nlohmann::json doc;
    doc["input"] = o.input;
    doc["output"] = o.output;
    doc["to"] = o.to;
    if (req.to == ckpt::convert_target::dcp) {
      doc["ranks"] = req.ranks;
      if (!o.plan.empty()) doc["plan"] = o.plan;
    }
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& op : req.ops) ops.push_back(op.describe());
    doc["operations"] = ops;
    doc["tensors"] = plan.tensors.size();
    doc["renamed"] = plan.keys.changed;
    doc["unused_operations"] = plan.keys.unused_ops;
    nlohmann::json ties = nlohmann::json::array();
    for (const auto& [alias, kept] : plan.ties) ties.push_back({{"alias", alias}, {"kept", kept}});
    doc["ties"] = ties;
    doc["dropped"] = plan.dropped;
    doc["files"] = r.files;
    doc["bytes_written"] = r.bytes_written;
    ckpt::write_json_with_pairs(doc, "mapping", plan.keys.mapping, [&out](std::string_view s) { out << s; });
    out << "\n";
    return;
  }
  out << "converted " << plan.tensors.size() << " tensors";
  if (plan.keys.changed) out << " (" << plan.keys.changed << " renamed)";
  out << " to " << o.to << "; wrote " << ckpt::display_name(o.output);
  if (req.to == ckpt::convert_target::hf) out << " (" << r.files.size() << " files)";
  if (req.to == ckpt::convert_target::dcp)
    out << " (" << req.ranks << " rank" << (req.ranks == 1 ? "" : "s") << ", " << r.files.size() << " files)";
  out << " (" << human_bytes(r.bytes_written) << ")\n";
}

void warn_abandoned(const ckpt::output_dir& dir) {
  for (const auto& d : dir.abandoned_removed())
    spdlog::warn("removed {}: the staging directory of an earlier run that ended before its commit (killed)",
                 ckpt::display_name(d));
}

// Test hook for the parallel failure tests (tests/py/test_distributed.py): the rank this
// names kills itself (SIGKILL: no handler, no cleanup) once it has written part of a file.
void install_test_kill(ckpt::convert_request& req, int rank) {
  const char* named = std::getenv("CKPTOOL_TEST_KILL_RANK");
  if (!named || std::to_string(rank) != named) return;
  req.progress = [](uint64_t done, uint64_t) {
    if (done > 0) ::kill(::getpid(), SIGKILL);
  };
}

// Test hook for the commit tests (tests/py/test_distributed_commit.py):
// CKPTOOL_TEST_DELAY_RANK=R:SECONDS makes rank R sleep after its last check, just before
// it reports ready to commit (on rank 0, after `.metadata` is written).
std::function<void()> with_test_delay(std::function<void()> check, int rank) {
  const char* spec = std::getenv("CKPTOOL_TEST_DELAY_RANK");
  if (!spec) return check;
  const std::string s = spec;
  const size_t colon = s.find(':');
  if (colon == std::string::npos || s.substr(0, colon) != std::to_string(rank)) return check;
  const double seconds = std::atof(s.c_str() + colon + 1);
  return [check = std::move(check), seconds] {
    check();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  };
}

int run_convert(const convert_options& o) {
  // Under torchrun the ranks divide the output files (docs/distributed.md); rank 0 reports.
  const std::unique_ptr<ckpt::process_group> group = open_process_group(o.dist);
  const bool parallel = group->world() > 1;
  const bool rank0 = group->rank() == 0;
  ckpt::convert_request req = make_request(o);
  const bool to_dcp = req.to == ckpt::convert_target::dcp;
  const bool to_set = req.to == ckpt::convert_target::hf || to_dcp;
  if (!to_set && o.force)
    throw ckpt::error(ckpt::errc::usage, "--force applies to --to hf and --to dcp (an output directory) only; convert "
                                         "never replaces its input");
  // Only a set's files are divided among ranks; one file is one process's work, and
  // running it on every rank would only race.
  if (parallel && !to_set)
    throw ckpt::error(ckpt::errc::usage, "under torchrun only --to hf and --to dcp are divided among ranks; --to " +
                                             o.to + " is written by one process: run it without a launcher");

  // Everything read and everything written, declared before anything is read or written.
  ckpt::output_set set;
  std::unique_ptr<ckpt::output_dir> dir;
  ckpt::output_file* out = nullptr;
  ckpt::checkpoint c;
  ckpt::convert_plan plan;
  std::vector<std::string> files;
  std::ostream* text = &std::cout;
  ckpt::run_collectively(*group, "convert/prepare", [&] {
    const std::vector<std::string> inputs = ckpt::checkpoint_input_files(o.input);
    mode_t mode = 0644;
    for (const auto& path : inputs) mode = set.add_input(path).mode & 0777;
    for (const auto& path : o.edits.map->results()) set.add_input(path);
    // A --match target that is a set (shard set, DCP directory) is every file of it.
    for (const auto& path : o.edits.match->results())
      for (const auto& f : ckpt::checkpoint_input_files(path)) set.add_input(f);
    if (to_set) {
      if (o.output == "-")
        throw ckpt::error(ckpt::errc::usage, std::string(to_dcp ? "a DCP checkpoint" : "a shard set") +
                                                 " is written to a directory, not to standard output");
      // Rank 0 alone owns the output directory: its checks, its staging directory, its commit.
      if (rank0)
        dir = std::make_unique<ckpt::output_dir>(o.output, to_dcp ? ckpt::set_layout::dcp : ckpt::set_layout::hf_index,
                                                 o.force);
      // A set's directory is an input: OUTDIR may be neither inside it nor around it. A
      // single file's directory is not (OUTDIR beside model.pt is the usual case), but the
      // file itself may never be among the previous set's files that the commit replaces
      // (out/model.safetensors converted into out/ was replaced by its own output).
      if (dir)
        for (const auto& path : inputs) inputs.size() > 1 ? dir->add_input(path) : dir->add_input_file(path);
    } else {
      out = &set.add_output(o.output, mode);
    }
    if (set.writes_stdout()) text = &std::cerr;

    c = ckpt::open_checkpoint(o.input, o.reader);
    if (!o.state_dict.empty()) req.state_dict = ckpt::state_dict_path_named(c, o.state_dict);
    req.ops = key_ops_in_order(o.edits, {[&c] { return ckpt::keyed_tensors(c); }, c.path}, o.reader, o.code);
    plan = ckpt::plan_convert(c, req);
    if (to_dcp) {
      files = ckpt::dcp_files(plan, req.ranks);
    } else if (to_set) {
      files = ckpt::hf_set_files(plan, req.max_shard_size);
      if (files.empty())
        throw ckpt::error(ckpt::errc::usage, "no tensor to write: an empty state dict makes no shard set").with_file(c.path);
    }
  });

  ckpt::convert_result r;
  if (parallel) {
    install_test_kill(req, group->rank());
    const auto check = with_test_delay([&set] { set.check_inputs_unchanged(); }, group->rank());
    r = to_dcp ? ckpt::write_converted_dcp(*group, c, plan, dir.get(), files, req, check)
               : ckpt::write_converted_hf_set(*group, c, plan, dir.get(), files, req, check);
    if (!rank0) return 0;
    warn_abandoned(*dir);
    warn_input(c);
    report(o, req, plan, r, *text);
    return 0;
  }
  progress_bar bar("convert");
  if (bar.enabled()) req.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  try {
    if (to_dcp) {
      dir->open(files, files.back());
      r = ckpt::write_converted_dcp(c, plan, *dir, req);
    } else if (to_set) {
      dir->open(files, files.back());
      r = ckpt::write_converted_hf_set(c, plan, *dir, req);
    } else {
      set.open();
      r = ckpt::write_converted_file(c, plan, *out, req);
    }
  } catch (...) {
    bar.finish();
    throw;
  }
  bar.finish();
  // Every output together, last.
  if (dir) {
    set.check_inputs_unchanged();
    dir->commit();
    warn_abandoned(*dir);
  } else {
    set.commit();
  }
  warn_input(c);
  report(o, req, plan, r, *text);
  return 0;
}

}  // namespace

verb setup_convert(CLI::App& app) {
  auto o = std::make_shared<convert_options>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "Write a checkpoint's state dict as a torch.save file, a safetensors file, a Hugging Face shard "
                 "set or a torch.distributed.checkpoint directory, tensor by tensor, every value bit-identical");
  cmd->add_option("IN", o->input,
                  "A checkpoint ckptool reads: a torch.save or safetensors file, a Hugging Face shard set (its "
                  "*.index.json or directory), a torch.distributed.checkpoint directory")
      ->required();
  cmd->add_option("-o,--output", o->output,
                  "Where to write: a file ('-' for standard output), or for --to hf and --to dcp a directory")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--to", o->to,
                  "torch (torch.save zip), safetensors (one file), hf (a shard set) or dcp (a "
                  "torch.distributed.checkpoint directory)")
      ->required()
      ->type_name("FORMAT");
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "--to hf: the most bytes per shard, in the Hub's decimal units (\"5GB\", the default; \"500MB\")")
      ->type_name("SIZE");
  cmd->add_option("--ranks", o->ranks,
                  "--to dcp: lay the checkpoint out as this many ranks would have saved it, each tensor split in "
                  "row bands as DTensor's Shard(0) (default 1)")
      ->type_name("K")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--plan", o->plan,
                  "--to dcp: each key's DTensor placement over the --ranks mesh, a JSON file {\"GLOB\": "
                  "\"Shard(D)|Replicate()\"} (first match wins; unmatched keys get the default) or llama-tp")
      ->check(non_empty_path());
  cmd->add_option("--dtype", o->dtype,
                  "Cast floating tensors to this floating dtype, rounding as torch's Tensor.to does (integers and "
                  "bool are kept)")
      ->type_name("DTYPE");
  cmd->add_option("--select", o->select, "Convert only the keys of IN matching this glob (before the key edits); repeatable")
      ->type_name("GLOB")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--state-dict", o->state_dict,
                  "Convert the tensors under this path of IN's pickle (\"state_dict\" in a Lightning checkpoint; "
                  "'/' between levels); everything else is left out")
      ->type_name("PATH");
  cmd->add_flag("--drop-other", o->drop_other,
                "Leave out (and list) what the output cannot hold: entries besides the state dict's tensors, unsafe "
                "globals, safetensors metadata a torch file has no place for");
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->add_flag("--force", o->force, "--to hf, --to dcp: allow OUTDIR to hold other files (left alone)");
  add_key_edit_flags(*cmd, o->edits);
  add_reader_flags(*cmd, o->reader);
  add_code_flags(*cmd, o->code);
  add_distributed_flags(*cmd, o->dist);
  return {cmd, [o] { return run_convert(*o); }};
}

}  // namespace cli
