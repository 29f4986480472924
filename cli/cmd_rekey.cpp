#include "cmd_rekey.h"

#include <iomanip>
#include <iostream>
#include <memory>

#include <spdlog/spdlog.h>

#include "ckpt/error.h"
#include "ckpt/input_file.h"
#include "ckpt/output_set.h"
#include "ckpt/rekey_file.h"
#include "ckpt/report.h"
#include "base/text_escape.h"
#include "plugin/torch_plugin.h"
#include "ckpt/torchscript_code.h"
#include "common.h"
#include "load_guard.h"
#include "progress.h"
#include "validators.h"

namespace cli {
namespace {

struct rekey_options {
  std::string input, output;
  bool dry_run = false, json = false, force = false, keep_unsafe = false, drop_unsafe = false;
  std::string save_map;
  ckpt::open_options reader;
  code_options code;
  CLI::App* cmd = nullptr;
  // Option objects whose occurrences, in command-line order, are the operations.
  CLI::Option *output_opt;
  CLI::Option *strip_compiled, *strip_wrappers, *strip_prefix, *add_prefix, *add_compiled, *rename, *map, *match;
};

// --match TARGET: the TorchScript model's parameters and buffers, or another checkpoint's
// state dict.
std::vector<ckpt::keyed_tensor> target_tensors(const std::string& path, const ckpt::open_options& reader,
                                               const code_options& code) {
  ckpt::checkpoint t = ckpt::open_checkpoint(path, reader);
  if (t.format != ckpt::file_format::torchscript) {
    if (!t.state_dict) throw ckpt::error(ckpt::errc::unsupported, "--match: no state dict found").with_file(path);
    return ckpt::keyed_tensors(t);
  }
  ckpt::torchscript_info ts;
  try {
    const ckpt::zip::archive& ar = *t.single_file("--match").zip;
    if (!code.allow_code) ckpt::refuse_load_time_code(ar);
    const ckpt::torch_plugin_api& plugin = ckpt::torch_plugin();
    load_guard guard(path, code.load_timeout);
    ts = plugin.inspect_torchscript(path, ar, code.allow_code);
  } catch (ckpt::error& e) {
    e.with_file(path);
    throw;
  }
  std::vector<ckpt::keyed_tensor> out;
  for (const auto* list : {&ts.parameters, &ts.buffers})
    for (const auto& p : *list) {
      auto type = ckpt::dtype_from_name(p.dtype);
      if (type) out.push_back({p.name, *type, p.shape});
    }
  return out;
}

ckpt::key_op match_op(const ckpt::checkpoint& c, const std::string& target, const std::vector<ckpt::key_op>& so_far,
                      const ckpt::open_options& reader, const code_options& code) {
  std::vector<ckpt::keyed_tensor> source = ckpt::keyed_tensors(c);
  for (auto& t : source)
    for (const auto& op : so_far) t.key = ckpt::apply_op(op, t.key);
  ckpt::align_policy policy;
  policy.target = "--match " + target;
  ckpt::match_result m = ckpt::align_keys(source, target_tensors(target, reader, code), policy, c.path);
  for (const auto& d : m.dtype_mismatches) spdlog::warn("--match: dtype differs: {}", ckpt::escape_controls(d));
  spdlog::info("--match {}: edit chosen: {}", ckpt::display_name(target), ckpt::escape_controls(m.edit));
  std::map<std::string, std::string> mapping(m.mapping.begin(), m.mapping.end());
  return ckpt::make_map_op(std::move(mapping), "--match " + target + " (" + m.edit + ")", /*follow_modules=*/true);
}

std::vector<ckpt::key_op> ops_in_order(const rekey_options& o, const ckpt::checkpoint& c) {
  std::vector<ckpt::key_op> ops;
  std::map<const CLI::Option*, size_t> used;
  for (const CLI::Option* opt : o.cmd->parse_order()) {
    size_t i = used[opt]++;
    auto arg = [&] { return opt->results().at(i); };
    if (opt == o.strip_compiled) ops.push_back(ckpt::make_op(ckpt::key_op::strip_compiled));
    else if (opt == o.strip_wrappers) ops.push_back(ckpt::make_op(ckpt::key_op::strip_wrappers));
    else if (opt == o.strip_prefix) ops.push_back(ckpt::make_op(ckpt::key_op::strip_prefix, arg()));
    else if (opt == o.add_prefix) ops.push_back(ckpt::make_op(ckpt::key_op::add_prefix, arg()));
    else if (opt == o.add_compiled) ops.push_back(ckpt::make_op(ckpt::key_op::add_compiled, arg()));
    else if (opt == o.rename) ops.push_back(ckpt::make_rename_op(arg()));
    else if (opt == o.map) ops.push_back(ckpt::make_map_op(ckpt::mapping_from_json(ckpt::read_text_input(arg()), arg()), arg(), false));
    else if (opt == o.match) ops.push_back(match_op(c, arg(), ops, o.reader, o.code));
  }
  return ops;
}

int run_rekey(const rekey_options& given) {
  // A directory stands for the one model file it holds; DCP directories are refused here.
  rekey_options o = given;
  o.input = ckpt::resolve_checkpoint_path(given.input);
  if (is_file_set(o.input))
    throw ckpt::error(ckpt::errc::unsupported,
                      "rekey of a torch.distributed.checkpoint directory is not supported yet (inspect, verify and "
                      "materialize read it)")
        .with_file(o.input);
  bool has_output = o.output_opt->count() > 0;
  if (!o.dry_run && !has_output) throw ckpt::error(ckpt::errc::usage, "rekey needs -o OUT (or --dry-run)");
  if (o.dry_run && !o.save_map.empty())
    throw ckpt::error(ckpt::errc::usage, "--dry-run writes nothing, so it cannot --save-map (--json shows the mapping)");
  if (o.keep_unsafe && o.drop_unsafe) throw ckpt::error(ckpt::errc::usage, "--keep-unsafe and --drop-unsafe exclude each other");

  // Everything read and everything written, declared before anything is read or written.
  ckpt::output_set set;
  ckpt::file_fingerprint in = set.add_input(o.input, o.force ? "" : "pass --force to replace IN (only once the new file is complete)");
  for (const CLI::Option* opt : {o.map, o.match})
    for (const auto& path : opt->results()) set.add_input(path);
  ckpt::output_file* out = nullptr;
  ckpt::output_file* map_out = nullptr;
  // Outputs keep the input's permission bits: a private checkpoint stays private.
  mode_t mode = in.mode & 0777;
  if (!o.dry_run) out = &set.add_output(o.output, mode, o.force ? o.input : std::string());
  if (!o.save_map.empty()) map_out = &set.add_output(o.save_map, mode);
  std::ostream& report = set.writes_stdout() ? std::cerr : std::cout;

  ckpt::checkpoint c = ckpt::open_checkpoint(o.input, o.reader);
  ckpt::rekey_request req;
  req.ops = ops_in_order(o, c);
  if (req.ops.empty()) throw ckpt::error(ckpt::errc::usage, "no operation given (see ckptool rekey --help)");
  req.dry_run = o.dry_run;
  req.reader = o.reader;
  req.release_input = true;  // c is not used after the write
  req.unsafe = o.keep_unsafe ? ckpt::unsafe_policy::keep : o.drop_unsafe ? ckpt::unsafe_policy::drop : ckpt::unsafe_policy::refuse;
  if (!o.dry_run) {
    set.open();
    req.output = out;
  }
  progress_bar bar("rekey");
  if (bar.enabled() && !o.dry_run) req.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  ckpt::rekey_result r;
  try {
    r = ckpt::rekey_file(c, req);
  } catch (...) {
    bar.finish();
    throw;
  }
  bar.finish();

  for (const auto& op : r.plan.unused_ops) spdlog::warn("{} changed no key (a typo?)", ckpt::escape_controls(op));
  for (const auto& d : r.dropped) spdlog::warn("--drop-unsafe removed entry {}", ckpt::display_name(d));
  if (map_out) {
    std::string text = ckpt::mapping_to_json(r.plan.mapping);
    map_out->write(text.data(), text.size());
  }
  // Every output together, last; a dry run checks that what it reported on held still.
  set.commit();

  if (o.json) {
    nlohmann::json doc;
    doc["input"] = o.input;
    doc["output"] = o.dry_run ? nlohmann::json(nullptr) : nlohmann::json(o.output);
    doc["dry_run"] = o.dry_run;
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& op : req.ops) ops.push_back(op.describe());
    doc["operations"] = ops;
    doc["changed"] = r.plan.changed;
    doc["unused_operations"] = r.plan.unused_ops;
    doc["mirrored_dicts"] = r.mirrored_dicts;
    doc["metadata_renamed"] = r.metadata_renamed;
    doc["dropped"] = r.dropped;
    doc["bytes_written"] = r.bytes_written;
    // The mapping (a million entries for a million tensors) is written, not built as a tree.
    ckpt::write_json_with_pairs(doc, "mapping", r.plan.mapping, [&report](std::string_view s) { report << s; });
    report << "\n";
  } else {
    std::vector<std::pair<std::string, std::string>> shown;
    if (o.dry_run || r.plan.changed <= 50)
      for (auto& [from, to] : r.plan.mapping)
        if (from != to) shown.emplace_back(ckpt::display_name(from), ckpt::display_name(to));
    size_t width = 3;
    for (auto& [from, to] : shown) width = std::max(width, std::min<size_t>(from.size(), 60));
    for (auto& [from, to] : shown) report << "  " << std::left << std::setw(int(width)) << from << "  ->  " << to << "\n";
    report << r.plan.changed << " of " << r.plan.mapping.size() << " keys renamed";
    if (r.metadata_renamed) report << ", " << r.metadata_renamed << " _metadata module paths";
    if (!r.mirrored_dicts.empty()) report << ", also in " << r.mirrored_dicts.size() << " mirroring dict(s)";
    if (o.dry_run)
      report << " (dry run: nothing written)\n";
    else
      report << "; wrote " << ckpt::display_name(o.output) << " (" << human_bytes(r.bytes_written) << ")\n";
  }
  return 0;
}

}  // namespace

verb setup_rekey(CLI::App& app) {
  auto o = std::make_shared<rekey_options>();
  CLI::App* cmd = app.add_subcommand(
      "rekey", "Strip, add or rename key segments (_orig_mod., module., ...) so compiled and uncompiled "
               "checkpoints load into each other; everything else is kept exactly");
  o->cmd = cmd;
  cmd->add_option("IN", o->input, "torch.save zip archive or safetensors file")->required();
  o->output_opt = cmd->add_option("-o,--output", o->output,
                                  "Where to write the result (same format as IN); '-' for standard output")
                      ->check(non_empty_path());
  auto ops = "Operations (applied in the order given)";
  o->strip_compiled = cmd->add_flag("--strip-compiled", "Remove every '_orig_mod.' segment (torch.compile)")
                          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  o->strip_wrappers = cmd->add_flag("--strip-wrappers",
                                    "Remove every wrapper segment: _orig_mod., a leading module. (DDP), "
                                    "_fsdp_wrapped_module., _checkpoint_wrapped_module., _forward_module.")
                          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  o->strip_prefix = cmd->add_option("--strip-prefix", "Remove this leading prefix where present")
                        ->type_name("P")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  o->add_prefix = cmd->add_option("--add-prefix", "Add this prefix to every key")
                      ->type_name("P")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  o->add_compiled = cmd->add_option("--add-compiled",
                                    "Insert '_orig_mod.' after module path PATH ('' for the root), for a model "
                                    "whose submodule PATH is compiled")
                        ->type_name("PATH")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  o->rename = cmd->add_option("--rename", "Replace every match of an RE2 regex in each key (re.sub-like; $1..$9, $& and $$ in "
                              "REPLACEMENT; a '=' inside REGEX is written \\=; no lookaround or backreferences)")
                  ->type_name("REGEX=REPLACEMENT")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  o->match = cmd->add_option("--match",
                             "Align the keys to a TorchScript model or another checkpoint: find the wrapper-segment "
                             "edit that makes the key sets equal, check shapes, apply it")
                 ->type_name("TARGET")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  o->map = cmd->add_option("--map", "Apply a key map written by --save-map")
               ->type_name("FILE")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group(ops);
  cmd->add_option("--save-map", o->save_map, "Write the applied old->new mapping as JSON")
      ->type_name("FILE")->check(non_empty_path());
  cmd->add_flag("--dry-run", o->dry_run, "Print the old -> new table and write nothing");
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->add_flag("--force", o->force, "Allow OUT to be IN itself (replaced only once the new file is complete)");
  cmd->add_flag("--keep-unsafe", o->keep_unsafe, "Keep entries naming unsafe globals as they are (never run)");
  cmd->add_flag("--drop-unsafe", o->drop_unsafe, "Remove the top-level entries naming unsafe globals");
  add_reader_flags(*cmd, o->reader);
  add_code_flags(*cmd, o->code);
  return {cmd, [o] { return run_rekey(*o); }};
}

}  // namespace cli
