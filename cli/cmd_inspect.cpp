#include "cmd_inspect.h"

#include <malloc.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "ckpt/error.h"
#include "ckpt/output_set.h"
#include "ckpt/report.h"
#include "plugin/torch_plugin.h"
#include "report/pt2_report.h"
#include "ckpt/torchscript_code.h"
#include "aoti_cli.h"
#include "common.h"
#include "input_spec.h"
#include "inspect_text.h"
#include "load_guard.h"

namespace cli {
namespace {

struct inspect_options {
  std::string file;
  bool json = false;
  bool pretty = false;
  text_options text;
  std::vector<std::string> inputs;
  std::vector<std::string> args;
  std::string method = "forward";
  ckpt::open_options reader;
  code_options code;
};

// The process exits right after the report: freeing a checkpoint of 100,000 tensors (its
// pickle tree, tables and strings) would take as long as printing it, so it is kept, and
// reachable, to the end (LeakSanitizer builds see no leak).
ckpt::checkpoint* g_kept_checkpoint = nullptr;

int run_inspect(const inspect_options& given) {
  // Inspect builds large trees of small blocks and drops them (a DCP .metadata's pickle is
  // 150 MB of nodes for 80,000 chunks) before building the records and the report: kept in
  // the heap rather than returned to the kernel, that memory is reused instead of faulted in
  // afresh (a fifth fewer page faults, 5% of the time). Inspect holds no large buffer.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // A directory stands for the one model file it holds, or its shard index, or is a DCP checkpoint.
  inspect_options o = given;
  o.file = ckpt::resolve_checkpoint_path(given.file);
  ckpt::output_set inputs;  // no outputs: it refuses a FIFO and sees the file change
  add_checkpoint_inputs(inputs, o.file);
  // AOTInductor packages (formats.md §15): read here until pt2 detection joins the generic open.
  if (is_aoti_package_file(o.file)) {
    if (!o.inputs.empty() || !o.args.empty())
      throw ckpt::error(ckpt::errc::usage, "--input/--arg: an AOTInductor package is not run by inspect");
    int rc = inspect_aoti(o.file, o.json, o.pretty);
    inputs.check_inputs_unchanged();
    return rc;
  }
  // Metadata only, unless --chunks asks where each chunk's data lies.
  o.reader.read_chunk_archives = o.text.chunks;
  auto owned = std::make_unique<ckpt::checkpoint>(ckpt::open_checkpoint(o.file, o.reader));
  g_kept_checkpoint = owned.release();
  const ckpt::checkpoint& c = *g_kept_checkpoint;
  std::optional<ckpt::torchscript_info> ts;
  std::vector<ckpt::meta_output> outputs;
  if (c.format == ckpt::file_format::torchscript) {
    try {
      // Refused before LibTorch is even loaded (the plugin checks again for embedders).
      const ckpt::zip::archive& ar = *c.single_file("inspect of TorchScript").zip;
      if (!o.code.allow_code) ckpt::refuse_load_time_code(ar);
      const ckpt::torch_plugin_api& plugin = ckpt::torch_plugin();
      load_guard guard(o.file, o.code.load_timeout);
      ts = plugin.inspect_torchscript(o.file, ar, o.code.allow_code);
      if (!o.inputs.empty() || !o.args.empty()) {
        std::vector<ckpt::input_spec> specs;
        for (const auto& s : o.inputs) specs.push_back(parse_input_spec(s));
        std::vector<ckpt::arg_spec> args;
        for (const auto& s : o.args) args.push_back(parse_arg_spec(s));
        outputs = plugin.run_on_meta(o.file, ar, o.method, specs, o.code.allow_code, args);
      }
    } catch (ckpt::error& e) {
      e.with_file(o.file);
      throw;
    }
  } else if (o.text.graph && !c.pt2) {
    throw ckpt::error(ckpt::errc::usage, "--graph needs a torch.export archive (.pt2); " + o.file + " is " +
                                             ckpt::format_name(c.format));
  } else if (!o.inputs.empty() || !o.args.empty()) {
    throw ckpt::error(ckpt::errc::usage, std::string(o.inputs.empty() ? "--arg" : "--input") + " needs a TorchScript model; " + o.file + " is " +
                                             ckpt::format_name(c.format));
  }

  // A report about bytes that changed while they were read describes no file at all.
  inputs.check_inputs_unchanged();

  if (o.json) {
    ckpt::inspect_json_options jo;
    jo.extra["ckptool_version"] = CKPTOOL_VERSION;
    // Indented for a reader at a terminal; for a pipe or a file, without the whitespace,
    // which is over 40% of the text of a large set's document and of the time to write it.
    jo.indent = o.pretty || stdout_is_terminal() ? 2 : -1;
    if (!o.text.filter.empty()) {
      // A state dict's tensors are matched by their keys (a tied tensor by any of them, a
      // pickled module's by what its state_dict() calls them), as the text lists them.
      std::vector<bool> keyed(c.tensors.size(), false), kept(c.tensors.size(), false);
      for (size_t k = 0; k < c.keys.size(); ++k) {
        const bool match = key_matches(o.text.filter, std::string(c.keys.key(k)));
        for (size_t p = 0; p < c.keys.piece_count(k); ++p) {
          const size_t i = c.keys.piece(k, p).tensor;
          keyed[i] = true;
          kept[i] = kept[i] || match;
        }
      }
      jo.keep_tensor = [&, keyed = std::move(keyed), kept = std::move(kept)](const ckpt::tensor_record& t) {
        const size_t i = size_t(&t - c.tensors.data());
        if (keyed[i]) return bool(kept[i]);
        std::string key;
        if (!t.path.empty()) {
          const auto& last = t.path.back();
          key = std::holds_alternative<std::string>(last) ? std::get<std::string>(last)
                                                          : std::to_string(std::get<int64_t>(last));
        }
        return key_matches(o.text.filter, key);
      };
    }
    if (ts) {
      auto tensors = [](const std::vector<ckpt::ts_tensor>& v) {
        nlohmann::json a = nlohmann::json::array();
        for (const auto& t : v) {
          nlohmann::json j = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}};
          if (!t.tied_to.empty()) j["tied_to"] = t.tied_to;
          a.push_back(std::move(j));
        }
        return a;
      };
      nlohmann::json m;
      m["type"] = ts->type;
      m["training"] = ts->training;
      m["parameters"] = tensors(ts->parameters);
      m["buffers"] = tensors(ts->buffers);
      m["methods"] = nlohmann::json::array();
      for (const auto& x : ts->methods) m["methods"].push_back({{"name", x.name}, {"schema", x.schema}});
      m["submodule_methods"] = nlohmann::json::array();
      for (const auto& x : ts->submodule_methods)
        m["submodule_methods"].push_back({{"name", x.name}, {"schema", x.schema}});
      m["submodules"] = nlohmann::json::array();
      for (const auto& x : ts->submodules) m["submodules"].push_back({{"name", x.name}, {"type", x.type}});
      m["attributes"] = nlohmann::json::array();
      for (const auto& x : ts->attributes)
        m["attributes"].push_back({{"name", x.name}, {"type", x.type}, {"value", x.value}});
      jo.extra["module"] = std::move(m);
      jo.extra_bytes_read = ts->bytes_read;
      if (!o.inputs.empty() || !o.args.empty()) {
        nlohmann::json outs = nlohmann::json::array();
        for (const auto& x : outputs) {
          nlohmann::json j = {{"path", x.path}, {"type", x.type}};
          if (x.is_tensor) {
            j["dtype"] = x.dtype;
            j["shape"] = x.shape;
          } else {
            j["value"] = x.value;
          }
          outs.push_back(std::move(j));
        }
        jo.extra["outputs"] = {{"method", o.method}, {"values", std::move(outs)}};
      }
    }
    if (c.pt2) jo.extra["pt2"] = ckpt::pt2_inspect_json(c, o.text.graph);
    // Keys may hold invalid UTF-8 (bytes decoded leniently): replaced rather than refused.
    ckpt::write_inspect_json(c, jo, [](std::string_view text) { std::cout.write(text.data(), std::streamsize(text.size())); });
    std::cout << "\n";
  } else {
    print_inspect_text(std::cout, c, ts ? &*ts : nullptr, o.text);
    if (!o.inputs.empty() || !o.args.empty()) print_meta_outputs(std::cout, o.method, outputs);
  }
  std::cout.flush();
  if (!std::cout) throw ckpt::error(ckpt::errc::io, "cannot write to standard output");
  return 0;
}

}  // namespace

verb setup_inspect(CLI::App& app) {
  auto opts = std::make_shared<inspect_options>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show what a checkpoint holds (tensors, dtypes, shapes, wrappers, entries, unsafe globals), "
                 "reading metadata only");
  cmd->add_option("FILE", opts->file, "torch.save, TorchScript, safetensors, torch.export (.pt2) or legacy torch file, or a torch.distributed.checkpoint directory")->required();
  CLI::Option* json = cmd->add_flag("--json", opts->json,
                "Print one JSON document (schema: man ckptool-inspect): indented on a terminal, on one line "
                "otherwise");
  cmd->add_flag("--pretty", opts->pretty, "With --json: indent the document even when not printing to a terminal")
      ->needs(json);
  cmd->add_flag("--tree", opts->text.tree, "Group keys into a module tree with element counts");
  cmd->add_option("--filter", opts->text.filter, "Only keys matching this shell glob, e.g. '*.attn.*'");
  cmd->add_flag("--graph", opts->text.graph,
                "torch.export archive (.pt2): list every node of each program with its output dtypes and shapes "
                "(symbolic dims as the export recorded them) and its module");
  cmd->add_flag("--chunks", opts->text.chunks,
                "torch.distributed.checkpoint: open every chunk's archive (checked against .metadata) and list "
                "each tensor's chunks with the byte range of their data");
  cmd->add_option("--input", opts->inputs,
                  "TorchScript: run the method on a meta tensor of this shape (repeat per argument), "
                  "e.g. 4x5:int64")
      ->type_name("SHAPE[:DTYPE]");
  cmd->add_option("--arg", opts->args,
                  "TorchScript: a non-tensor argument of the method (int, float, bool, str, None, List[int]): "
                  "VALUE in order after the --input tensors, or NAME=VALUE")
      ->type_name("[NAME=]VALUE");
  cmd->add_option("--method", opts->method, "TorchScript method to run with --input/--arg (a submodule's too: "
                  "blocks.0.forward)")->capture_default_str();
  add_reader_flags(*cmd, opts->reader);
  add_code_flags(*cmd, opts->code);
  return {cmd, [opts] { return run_inspect(*opts); }};
}

}  // namespace cli
