#include "key_edits.h"

#include <map>

#include <spdlog/spdlog.h>

#include "base/text_escape.h"
#include "ckpt/error.h"
#include "ckpt/input_file.h"
#include "ckpt/torchscript_code.h"
#include "plugin/torch_plugin.h"

namespace cli {
namespace {

// --match TARGET: the TorchScript model's parameters and buffers, or another checkpoint's
// state dict (a file, a shard set, a DCP directory: its chunk archives are not opened, a
// key's global shape is in .metadata).
std::vector<ckpt::keyed_tensor> target_tensors(const std::string& path, ckpt::open_options reader,
                                               const code_options& code) {
  reader.read_chunk_archives = false;
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

ckpt::key_op match_op(const match_source& src, const std::string& target, const std::vector<ckpt::key_op>& so_far,
                      const ckpt::open_options& reader, const code_options& code) {
  std::vector<ckpt::keyed_tensor> source = src.tensors();
  for (auto& t : source)
    for (const auto& op : so_far) t.key = ckpt::apply_op(op, t.key);
  ckpt::align_policy policy;
  policy.target = "--match " + target;
  ckpt::match_result m = ckpt::align_keys(source, target_tensors(target, reader, code), policy, src.path);
  for (const auto& d : m.dtype_mismatches) spdlog::warn("--match: dtype differs: {}", ckpt::escape_controls(d));
  spdlog::info("--match {}: edit chosen: {}", ckpt::display_name(target), ckpt::escape_controls(m.edit));
  std::map<std::string, std::string> mapping(m.mapping.begin(), m.mapping.end());
  return ckpt::make_map_op(std::move(mapping), "--match " + target + " (" + m.edit + ")", /*follow_modules=*/true);
}

}  // namespace

std::vector<ckpt::key_op> key_ops_in_order(const key_edit_flags& o, const match_source& source,
                                           const ckpt::open_options& reader, const code_options& code) {
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
    else if (opt == o.match) ops.push_back(match_op(source, arg(), ops, reader, code));
  }
  return ops;
}

void add_key_edit_flags(CLI::App& cmd, key_edit_flags& f, const std::string& group, bool with_match) {
  f.cmd = &cmd;
  const auto all = CLI::MultiOptionPolicy::TakeAll;
  f.strip_compiled = cmd.add_flag("--strip-compiled", "Remove every '_orig_mod.' segment (torch.compile)")
                         ->multi_option_policy(all)->group(group);
  f.strip_wrappers = cmd.add_flag("--strip-wrappers",
                                  "Remove every wrapper segment: _orig_mod., a leading module. (DDP), "
                                  "_fsdp_wrapped_module., _checkpoint_wrapped_module., _forward_module.")
                         ->multi_option_policy(all)->group(group);
  f.strip_prefix = cmd.add_option("--strip-prefix", "Remove this leading prefix where present")
                       ->type_name("P")->multi_option_policy(all)->group(group);
  f.add_prefix = cmd.add_option("--add-prefix", "Add this prefix to every key")
                     ->type_name("P")->multi_option_policy(all)->group(group);
  f.add_compiled = cmd.add_option("--add-compiled",
                                  "Insert '_orig_mod.' after module path PATH ('' for the root), for a model "
                                  "whose submodule PATH is compiled")
                       ->type_name("PATH")->multi_option_policy(all)->group(group);
  f.rename = cmd.add_option("--rename", "Replace every match of an RE2 regex in each key (re.sub-like; $1..$9, $& and $$ "
                            "in REPLACEMENT; a '=' inside REGEX is written \\=; no lookaround or backreferences)")
                 ->type_name("REGEX=REPLACEMENT")->multi_option_policy(all)->group(group);
  if (with_match)
    f.match = cmd.add_option("--match",
                           "Align the keys to a TorchScript model or another checkpoint: find the wrapper-segment "
                           "edit that makes the key sets equal, check shapes, apply it")
                ->type_name("TARGET")->multi_option_policy(all)->group(group);
  f.map = cmd.add_option("--map", "Apply a key map written by --save-map")
              ->type_name("FILE")->multi_option_policy(all)->group(group);
}

}  // namespace cli
