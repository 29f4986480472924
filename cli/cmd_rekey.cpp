#include "cmd_rekey.h"

#include <sys/stat.h>

#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>

#include <spdlog/spdlog.h>

#include "ckpt/error.h"
#include "ckpt/input_file.h"
#include "ckpt/output_set.h"
#include "ckpt/file_opener.h"
#include "ckpt/output_dir.h"
#include "ckpt/rekey_file.h"
#include "ckpt/rekey_set.h"
#include "ckpt/dcp_rekey.h"
#include "ckpt/report.h"
#include "base/text_escape.h"
#include "common.h"
#include "key_edits.h"
#include "load_guard.h"
#include "model/layout.h"
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
  CLI::Option* output_opt;
  key_edit_flags edits;
};

// A checkpoint's keys, dtypes and shapes from its metadata: a DCP directory's chunk
// archives are not opened (a key's global shape is in .metadata).
std::vector<ckpt::keyed_tensor> listed_tensors(const std::string& path, ckpt::open_options reader) {
  reader.read_chunk_archives = false;
  return ckpt::keyed_tensors(ckpt::open_checkpoint(path, reader));
}
std::vector<ckpt::key_op> ops_in_order(const rekey_options& o, const match_source& source) {
  return key_ops_in_order(o.edits, source, o.reader, o.code);
}

// The layout `path` names (formats.md §1.1), with `file` a path to open.
ckpt::detail::layout layout_of(const std::string& path) {
  struct stat st;
  const bool dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  const size_t slash = path.rfind('/');
  std::string root = path, name;
  if (!dir) {
    root = slash == std::string::npos ? "" : slash == 0 ? "/" : path.substr(0, slash);
    name = slash == std::string::npos ? path : path.substr(slash + 1);
    if (name.empty() || name == "." || name == "..") return {ckpt::detail::layout_kind::single_file, path, {}, {}};
  }
  const ckpt::disk_opener fs(root);
  ckpt::detail::layout l = ckpt::detail::detect_layout(fs, name);
  l.file = l.file == name ? path : fs.display(l.file);
  return l;
}

// The files --match reads, for a single output file's checks (no output may be one):
// every file of a target that is a set (a shard set, a DCP directory), as a single target
// file is one.
template <typename Add>
void declare_match_targets(const rekey_options& o, Add add) {
  for (const auto& path : o.edits.match->results())
    for (const auto& f : ckpt::checkpoint_input_files(path)) add(f);
}

void print_mapping(std::ostream& report, const ckpt::rekey_plan& plan, bool all) {
  std::vector<std::pair<std::string, std::string>> shown;
  if (all || plan.changed <= 50)
    for (auto& [from, to] : plan.mapping)
      if (from != to) shown.emplace_back(ckpt::display_name(from), ckpt::display_name(to));
  size_t width = 3;
  for (auto& [from, to] : shown) width = std::max(width, std::min<size_t>(from.size(), 60));
  for (auto& [from, to] : shown) report << "  " << std::left << std::setw(int(width)) << from << "  ->  " << to << "\n";
}

// The arguments a set's rekey refuses whatever its layout: a set goes to a directory.
void check_set_arguments(const rekey_options& o, const char* what) {
  const bool has_output = o.output_opt->count() > 0;
  if (!o.dry_run && !has_output) throw ckpt::error(ckpt::errc::usage, "rekey needs -o OUTDIR (or --dry-run)");
  if (has_output && o.output == "-")
    throw ckpt::error(ckpt::errc::usage, std::string(what) + " is written to a directory, not to standard output");
  if (o.dry_run && !o.save_map.empty())
    throw ckpt::error(ckpt::errc::usage, "--dry-run writes nothing, so it cannot --save-map (--json shows the mapping)");
}

// --save-map for a set: one more file of map_set, committed after the set, with the
// permission bits of `mode_of` (the index or .metadata), as a single file's map keeps its
// input's; never a file inside OUTDIR, which holds the set only.
ckpt::output_file* open_set_map(const rekey_options& o, ckpt::output_set& map_set, const std::string& mode_of) {
  if (o.save_map.empty()) return nullptr;
  for (const auto& path : o.edits.map->results()) map_set.add_input(path);
  struct stat in_st;
  const mode_t mode = ::stat(mode_of.c_str(), &in_st) == 0 ? (in_st.st_mode & 0777) : 0644;
  ckpt::output_file* map_out = &map_set.add_output(o.save_map, mode);
  struct stat out_st, map_dir_st;
  const std::string map_dir = ckpt::detail::parent_and_name(o.save_map).first;
  if (::stat(o.output.c_str(), &out_st) == 0 && ::stat(map_dir.empty() ? "." : map_dir.c_str(), &map_dir_st) == 0 &&
      out_st.st_dev == map_dir_st.st_dev && out_st.st_ino == map_dir_st.st_ino)
    throw ckpt::error(ckpt::errc::usage, "--save-map names a file inside the output directory, which holds the set "
                                         "only; nothing written")
        .with_file(o.save_map);
  return map_out;
}

// rekey INDEX|DIR -o OUTDIR: a Hugging Face shard set, written as a set (ckpt/output_dir.h).
int run_rekey_set(const rekey_options& o, const std::string& index) {
  check_set_arguments(o, "a shard set");
  if (o.keep_unsafe && o.drop_unsafe) throw ckpt::error(ckpt::errc::usage, "--keep-unsafe and --drop-unsafe exclude each other");

  ckpt::rekey_set_request req;
  req.ops = ops_in_order(o, {[&] { return ckpt::hf_set_keyed_tensors(index, o.reader); }, index});
  if (req.ops.empty()) throw ckpt::error(ckpt::errc::usage, "no operation given (see ckptool rekey --help)");
  req.dry_run = o.dry_run;
  req.reader = o.reader;
  req.unsafe = o.keep_unsafe ? ckpt::unsafe_policy::keep : o.drop_unsafe ? ckpt::unsafe_policy::drop : ckpt::unsafe_policy::refuse;

  ckpt::output_set map_set;
  ckpt::output_file* map_out = open_set_map(o, map_set, index);

  std::unique_ptr<ckpt::output_dir> out;
  if (!o.dry_run) out = std::make_unique<ckpt::output_dir>(o.output, ckpt::set_layout::hf_index, o.force);
  progress_bar bar("rekey");
  if (bar.enabled() && !o.dry_run) req.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  ckpt::rekey_set_result r;
  try {
    r = ckpt::rekey_hf_set(index, out.get(), req);
  } catch (...) {
    bar.finish();
    throw;
  }
  bar.finish();
  // The map may not replace a file of the input set (refused before any commit).
  if (map_out) {
    const size_t slash = index.rfind('/');
    const std::string in_dir = slash == std::string::npos ? "" : index.substr(0, slash + 1);
    for (const auto& name : r.files) map_set.add_input(in_dir + name);
  }
  for (const auto& n : r.notes) spdlog::warn("{}", ckpt::escape_controls(n));
  if (!r.left_behind.empty()) {
    std::string names;
    for (const auto& n : r.left_behind) names += (names.empty() ? "" : ", ") + ckpt::display_name(n);
    spdlog::warn("rekey writes the shard set only; beside the index, not {}: {} (copy them to load OUTDIR with "
                 "from_pretrained)", o.dry_run ? "to be written" : "written", names);
  }
  for (const auto& op : r.plan.unused_ops) spdlog::warn("{} changed no key (a typo?)", ckpt::escape_controls(op));
  for (const auto& d : r.dropped) spdlog::warn("--drop-unsafe removed entry {}", ckpt::display_name(d));
  if (map_out) {
    map_set.open();
    std::string text = ckpt::mapping_to_json(r.plan.mapping);
    map_out->write(text.data(), text.size());
  }
  std::vector<std::string> replaced;
  if (out) {
    replaced = out->previous_set();
    out->commit();
  }
  if (map_out) map_set.commit();

  std::ostream& report = std::cout;
  if (o.json) {
    nlohmann::json doc;
    doc["input"] = index;
    doc["output"] = o.dry_run ? nlohmann::json(nullptr) : nlohmann::json(o.output);
    doc["layout"] = "hf_index";
    doc["dry_run"] = o.dry_run;
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& op : req.ops) ops.push_back(op.describe());
    doc["operations"] = ops;
    doc["files"] = r.files;
    doc["replaced_previous_set"] = replaced;
    doc["changed"] = r.plan.changed;
    doc["unused_operations"] = r.plan.unused_ops;
    doc["mirrored_dicts"] = r.mirrored_dicts;
    doc["metadata_renamed"] = r.metadata_renamed;
    doc["dropped"] = r.dropped;
    doc["notes"] = r.notes;
    doc["left_behind"] = r.left_behind;
    doc["bytes_written"] = r.bytes_written;
    ckpt::write_json_with_pairs(doc, "mapping", r.plan.mapping, [&report](std::string_view s) { report << s; });
    report << "\n";
    return 0;
  }
  print_mapping(report, r.plan, o.dry_run);
  report << r.plan.changed << " of " << r.plan.mapping.size() << " keys renamed across " << (r.files.size() - 1)
         << " shard(s)";
  if (r.metadata_renamed) report << ", " << r.metadata_renamed << " _metadata module paths";
  if (!r.mirrored_dicts.empty()) report << ", also in " << r.mirrored_dicts.size() << " mirroring dict(s)";
  if (o.dry_run)
    report << " (dry run: nothing written)\n";
  else
    report << "; wrote " << ckpt::display_name(o.output) << " (" << r.files.size() << " files, "
           << human_bytes(r.bytes_written) << ")\n";
  return 0;
}

// rekey DIR -o OUTDIR: a torch.distributed.checkpoint directory (formats.md §9.7), written
// as a set (ckpt/output_dir.h): the .distcp files copied byte for byte, .metadata last.
int run_rekey_dcp(const rekey_options& o, const std::string& dir) {
  check_set_arguments(o, "a DCP checkpoint");
  // .metadata may name nothing but DCP's own dataclasses: there is no unsafe entry to keep
  // or drop, only a file to refuse.
  if (o.keep_unsafe || o.drop_unsafe)
    throw ckpt::error(ckpt::errc::usage, "--keep-unsafe and --drop-unsafe apply to torch.save files, not to a DCP "
                                         "directory (a .metadata naming unsafe globals is refused)");
  // --match aligns the tensor keys (.metadata's global shapes); BYTE_IO items follow the
  // module moves the edit teaches, as other unpaired keys do.
  const std::vector<ckpt::key_op> ops = ops_in_order(o, {[&] { return listed_tensors(dir, o.reader); }, dir});
  if (ops.empty()) throw ckpt::error(ckpt::errc::usage, "no operation given (see ckptool rekey --help)");

  // A disk_opener reaches the directory as a name below its parent ("run/" is "run").
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const auto [parent, name] = ckpt::detail::parent_and_name(trimmed);
  const ckpt::disk_opener fs(parent);
  ckpt::dcp_rekey_options opt;
  opt.lim = o.reader.pickle_limits;
  opt.dry_run = true;
  // Everything is planned and checked first: the names of the new set are what the output
  // directory's refusals are judged on, before it is made.
  ckpt::dcp_rekey_result r;
  try {
    r = ckpt::write_rekeyed_dcp(fs, name, ops, "", opt);
  } catch (ckpt::error& e) {
    if (e.file().empty()) e.with_file(dir);
    throw;
  }
  std::vector<std::string> files = r.data_files;
  files.insert(files.end(), r.other_files.begin(), r.other_files.end());
  files.insert(files.end(), r.metadata_files.begin(), r.metadata_files.end());
  const std::string& first_metadata = r.metadata_files.front();
  // N rank-local metadata files cannot be replaced in OUTDIR by one rename, as one
  // .metadata is: such a set goes only to a new directory, renamed into place whole.
  struct stat out_st;
  if (!o.dry_run && first_metadata != ".metadata" && ::lstat(o.output.c_str(), &out_st) == 0)
    throw ckpt::error(ckpt::errc::usage, "a DCP checkpoint with rank-local metadata (" +
                                             std::to_string(r.metadata_files.size()) +
                                             " __N.metadata files) is written only to a new directory, which appears "
                                             "whole; this one exists; nothing written")
        .with_file(o.output);

  ckpt::output_set map_set;
  ckpt::output_file* map_out = nullptr;
  std::unique_ptr<ckpt::output_dir> out;
  if (!o.dry_run) {
    out = std::make_unique<ckpt::output_dir>(o.output, ckpt::set_layout::dcp, o.force);
    out->add_input_dir(dir);
    for (const auto& f : files) out->add_input(dir + "/" + f);
    if (!o.save_map.empty())
      for (const auto& f : files) map_set.add_input(dir + "/" + f);
    map_out = open_set_map(o, map_set, dir + "/" + first_metadata);
    out->open(files, first_metadata);
    progress_bar bar("rekey");
    opt.dry_run = false;
    if (bar.enabled()) opt.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
    try {
      r = ckpt::write_rekeyed_dcp(fs, name, ops, out->staging_directory(), opt);
    } catch (ckpt::error& e) {
      bar.finish();
      if (e.file().empty()) e.with_file(dir);
      throw;
    }
    bar.finish();
  }
  for (const auto& g : r.byte_item_globals)
    spdlog::warn("non-tensor item names a global torch.load(weights_only=True) refuses (dcp.load unpickles it "
                 "with weights_only=False): {}", ckpt::escape_controls(g));
  for (const auto& op : r.plan.unused_ops) spdlog::warn("{} changed no key (a typo?)", ckpt::escape_controls(op));
  if (map_out) {
    map_set.open();
    const std::string text = ckpt::mapping_to_json(r.plan.mapping);
    map_out->write(text.data(), text.size());
  }
  std::vector<std::string> replaced;
  if (out) {
    replaced = out->previous_set();
    out->commit();
  }
  if (map_out) map_set.commit();

  std::ostream& report = std::cout;
  const uint64_t bytes = r.metadata_bytes + r.bytes_copied;
  if (o.json) {
    nlohmann::json doc;
    doc["input"] = dir;
    doc["output"] = o.dry_run ? nlohmann::json(nullptr) : nlohmann::json(o.output);
    doc["layout"] = "dcp";
    doc["dry_run"] = o.dry_run;
    nlohmann::json jops = nlohmann::json::array();
    for (const auto& op : ops) jops.push_back(op.describe());
    doc["operations"] = jops;
    doc["files"] = files;
    doc["replaced_previous_set"] = replaced;
    doc["changed"] = r.plan.changed;
    doc["unused_operations"] = r.plan.unused_ops;
    doc["storage_entries_renamed"] = r.storage_renamed;
    doc["planner_entries_renamed"] = r.planner_renamed;
    doc["byte_items"] = r.byte_items;
    doc["unchecked_byte_items"] = r.unchecked_byte_items;
    doc["unknown_fields"] = r.unknown_fields;
    doc["bytes_written"] = o.dry_run ? 0 : bytes;
    ckpt::write_json_with_pairs(doc, "mapping", r.plan.mapping, [&report](std::string_view s) { report << s; });
    report << "\n";
    return 0;
  }
  print_mapping(report, r.plan, o.dry_run);
  report << r.plan.changed << " of " << r.plan.mapping.size() << " keys renamed in "
         << (r.metadata_files.size() == 1 ? std::string(".metadata")
                                          : std::to_string(r.metadata_files.size()) + " rank-local metadata files")
         << " (" << r.storage_renamed
         << " chunk entries, " << r.planner_renamed << " planner entries)";
  if (o.dry_run)
    report << " (dry run: nothing written)\n";
  else
    report << "; wrote " << ckpt::display_name(o.output) << " (" << files.size() << " files, " << human_bytes(bytes)
           << ", data files copied byte for byte)\n";
  return 0;
}

int run_rekey(const rekey_options& given) {
  // A directory stands for the one model file it holds, the shard set it holds, or is a DCP checkpoint.
  rekey_options o = given;
  const ckpt::detail::layout l = layout_of(given.input);
  if (l.kind == ckpt::detail::layout_kind::hf_index) return run_rekey_set(o, l.file);
  if (l.kind == ckpt::detail::layout_kind::dcp) return run_rekey_dcp(o, given.input);
  if (l.kind == ckpt::detail::layout_kind::dcp_safetensors)
    throw ckpt::error(ckpt::errc::unsupported,
                      "rekey of a HuggingFaceStorageWriter directory (save_distributed=True pieces) is not supported: "
                      "its keys are spelled in every file's header and __metadata__ DCP_SHARDING_INFO")
        .with_file(given.input);
  o.input = ckpt::resolve_checkpoint_path(given.input);
  bool has_output = o.output_opt->count() > 0;
  if (!o.dry_run && !has_output) throw ckpt::error(ckpt::errc::usage, "rekey needs -o OUT (or --dry-run)");
  if (o.dry_run && !o.save_map.empty())
    throw ckpt::error(ckpt::errc::usage, "--dry-run writes nothing, so it cannot --save-map (--json shows the mapping)");
  if (o.keep_unsafe && o.drop_unsafe) throw ckpt::error(ckpt::errc::usage, "--keep-unsafe and --drop-unsafe exclude each other");

  // Everything read and everything written, declared before anything is read or written.
  ckpt::output_set set;
  ckpt::file_fingerprint in = set.add_input(o.input, o.force ? "" : "pass --force to replace IN (only once the new file is complete)");
  for (const auto& path : o.edits.map->results()) set.add_input(path);
  declare_match_targets(o, [&](const std::string& f) { set.add_input(f); });
  ckpt::output_file* out = nullptr;
  ckpt::output_file* map_out = nullptr;
  // Outputs keep the input's permission bits: a private checkpoint stays private.
  mode_t mode = in.mode & 0777;
  if (!o.dry_run) out = &set.add_output(o.output, mode, o.force ? o.input : std::string());
  if (!o.save_map.empty()) map_out = &set.add_output(o.save_map, mode);
  std::ostream& report = set.writes_stdout() ? std::cerr : std::cout;

  // rekey rewrites the pickle and copies the records; --match alone reads the keys' tensors.
  ckpt::open_options reader = o.reader;
  if (o.edits.match->count() == 0) reader.intent = ckpt::open_options::purpose::rewrite_pickle;
  ckpt::checkpoint c = ckpt::open_checkpoint(o.input, reader);
  // Sets take the paths above; anything else of several files is refused before anything
  // is created (rewriting a set means rewriting its index too).
  if (c.layout != ckpt::checkpoint_layout::single_file)
    throw ckpt::error(ckpt::errc::unsupported, std::string("rekey of a ") + ckpt::layout_name(c.layout) +
                                                   " checkpoint named this way is not supported; name its index or directory")
        .with_file(c.path);
  ckpt::rekey_request req;
  req.ops = ops_in_order(o, {[&c] { return ckpt::keyed_tensors(c); }, c.path});
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
    if (c.format == ckpt::file_format::pt2) {
      doc["constants_renamed"] = r.constants_renamed;
      doc["program_references"] = r.program_references;
    }
    doc["bytes_written"] = r.bytes_written;
    // The mapping (a million entries for a million tensors) is written, not built as a tree.
    ckpt::write_json_with_pairs(doc, "mapping", r.plan.mapping, [&report](std::string_view s) { report << s; });
    report << "\n";
  } else {
    print_mapping(report, r.plan, o.dry_run);
    report << r.plan.changed << " of " << r.plan.mapping.size() << " keys renamed";
    if (r.metadata_renamed) report << ", " << r.metadata_renamed << " _metadata module paths";
    if (!r.mirrored_dicts.empty()) report << ", also in " << r.mirrored_dicts.size() << " mirroring dict(s)";
    if (r.constants_renamed) report << ", " << r.constants_renamed << " constants";
    if (r.program_references) report << ", " << r.program_references << " places in the program(s)";
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
  cmd->add_option("IN", o->input,
                  "torch.save zip archive, safetensors file or torch.export (.pt2) archive; or a Hugging Face shard set (its *.index.json, or "
                  "the directory holding it), written as a set into the directory -o names")
      ->required();
  o->output_opt = cmd->add_option("-o,--output", o->output,
                                  "Where to write the result (same format as IN); '-' for standard output")
                      ->check(non_empty_path());
  add_key_edit_flags(*cmd, o->edits);
  cmd->add_option("--save-map", o->save_map, "Write the applied old->new mapping as JSON")
      ->type_name("FILE")->check(non_empty_path());
  cmd->add_flag("--dry-run", o->dry_run, "Print the old -> new table and write nothing");
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->add_flag("--force", o->force,
                "Allow OUT to be IN itself (replaced only once the new file is complete); for a set, allow OUTDIR to "
                "hold other files (left alone: only a previous set's files are ever removed)");
  cmd->add_flag("--keep-unsafe", o->keep_unsafe, "Keep entries naming unsafe globals as they are (never run)");
  cmd->add_flag("--drop-unsafe", o->drop_unsafe, "Remove the top-level entries naming unsafe globals");
  add_reader_flags(*cmd, o->reader);
  add_code_flags(*cmd, o->code);
  return {cmd, [o] { return run_rekey(*o); }};
}

}  // namespace cli
