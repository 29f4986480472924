#include "cmd_diff.h"

#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "base/text_escape.h"
#include "ckpt/diff.h"
#include "ckpt/error.h"
#include "ckpt/output_set.h"
#include "ckpt/report.h"
#include "common.h"
#include "key_edits.h"
#include "progress.h"
#include "validators.h"

namespace cli {
namespace {

struct diff_cli_options {
  std::string a, b;
  bool json = false;
  ckpt::diff_options diff;
  ckpt::open_options reader;
  key_edit_flags edits;
};

// JSON has no infinity: an error that is one is the string "inf" (docs/diff-json.md).
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json("inf"); }

std::string number_text(double v) {
  if (!std::isfinite(v)) return "inf";
  std::ostringstream s;
  s << v;  // 6 significant digits: a report, not a dump
  return s.str();
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

nlohmann::json entry_json(const std::optional<ckpt::entry_value>& e) {
  if (!e) return nullptr;
  return {{"type", e->type}, {"value", e->value}};
}

nlohmann::json report_json(const ckpt::diff_report& r, const ckpt::diff_options& o) {
  size_t counts[5] = {};
  nlohmann::json tensors = nlohmann::json::array();
  for (const ckpt::tensor_diff& t : r.tensors) {
    ++counts[size_t(t.values)];
    // Only what is worth a reader's attention: a million identical tensors are a count.
    if (t.values == ckpt::value_verdict::identical && !t.dtype_differs() && !t.shape_differs()) continue;
    if (r.metadata_only && !t.dtype_differs() && !t.shape_differs()) continue;
    nlohmann::json j = {{"key_a", t.key_a},
                        {"key_b", t.key_b},
                        {"dtype_a", ckpt::name(t.type_a)},
                        {"dtype_b", ckpt::name(t.type_b)},
                        {"shape_a", t.shape_a},
                        {"shape_b", t.shape_b},
                        {"values", ckpt::verdict_name(t.values)}};
    if (t.values == ckpt::value_verdict::not_compared) {
      j["reason"] = t.not_compared_reason;
    } else {
      j["elements"] = t.elements;
      j["bits_differ"] = t.bits_differ;
      j["not_equal"] = t.not_equal;
      j["outside_tolerance"] = t.outside;
      j["nan_mismatches"] = t.nan_mismatches;
      j["max_abs_error"] = number(t.max_abs_error);
      j["max_rel_error"] = number(t.max_rel_error);
      j["first_outside"] = t.first_outside ? nlohmann::json(*t.first_outside) : nlohmann::json(nullptr);
    }
    tensors.push_back(std::move(j));
  }
  nlohmann::json entries = nlohmann::json::array();
  for (const ckpt::entry_diff& e : r.entries)
    entries.push_back({{"path", e.path}, {"a", entry_json(e.a)}, {"b", entry_json(e.b)}});
  nlohmann::json renamed = nullptr;
  if (!r.renamed.empty()) {
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& [ka, kb] : r.renamed) pairs.push_back({{"a", ka}, {"b", kb}});
    renamed = {{"edit", r.rename_edit}, {"pairs", pairs}};
  }
  return {{"ckptool_diff", 1},
          {"a", {{"path", r.path_a}, {"format", r.format_a}, {"layout", r.layout_a}, {"keys", r.keys_a},
                 {"key_edits", r.edits_a}, {"unused_key_edits", r.unused_edits_a}}},
          {"b", {{"path", r.path_b}, {"format", r.format_b}, {"layout", r.layout_b}, {"keys", r.keys_b}}},
          {"equivalent", r.equivalent()},
          {"metadata_only", r.metadata_only},
          {"tolerance", {{"atol", o.atol}, {"rtol", o.rtol}, {"equal_nan", o.equal_nan}}},
          {"paired", r.tensors.size()},
          {"values",
           {{"identical", counts[size_t(ckpt::value_verdict::identical)]},
            {"equal", counts[size_t(ckpt::value_verdict::equal)]},
            {"close", counts[size_t(ckpt::value_verdict::close)]},
            {"different", counts[size_t(ckpt::value_verdict::different)]},
            {"not_compared", counts[size_t(ckpt::value_verdict::not_compared)]}}},
          {"only_in_a", r.only_in_a},
          {"only_in_b", r.only_in_b},
          {"renamed", renamed},
          {"tensors", tensors},
          {"entries", entries},
          {"entries_compared_by_summary", r.entries_elided},
          {"bytes_compared", r.bytes_compared}};
}

void print_text(const ckpt::diff_report& r, const ckpt::diff_options& o) {
  using ckpt::display_name;
  using ckpt::escape_controls;
  size_t identical = 0, equal = 0, close = 0, different = 0, not_compared = 0, dtypes = 0, shapes = 0;
  for (const ckpt::tensor_diff& t : r.tensors) {
    dtypes += t.dtype_differs();
    shapes += t.shape_differs();
    switch (t.values) {
      case ckpt::value_verdict::identical: ++identical; break;
      case ckpt::value_verdict::equal: ++equal; break;
      case ckpt::value_verdict::close: ++close; break;
      case ckpt::value_verdict::different: ++different; break;
      case ckpt::value_verdict::not_compared: ++not_compared; break;
    }
  }
  // The summary line first: what a reader (or a CI log) needs if it reads nothing else.
  std::vector<std::string> parts;
  auto count = [&](size_t n, const std::string& what) {
    if (n) parts.push_back(std::to_string(n) + " " + what);
  };
  const bool same = r.equivalent();
  if (same) {
    count(r.tensors.size(), r.tensors.size() == 1 ? "tensor" : "tensors");
    if (!r.metadata_only) {
      count(identical, "identical");
      count(equal, "equal in value, not in bits");
      count(close, "within tolerance");
    }
  } else {
    count(r.only_in_a.size(), r.only_in_a.size() == 1 ? "key only in A" : "keys only in A");
    count(r.only_in_b.size(), r.only_in_b.size() == 1 ? "key only in B" : "keys only in B");
    count(r.renamed.size(), r.renamed.size() == 1 ? "key renamed" : "keys renamed");
    count(dtypes, dtypes == 1 ? "dtype differs" : "dtypes differ");
    count(shapes, shapes == 1 ? "shape differs" : "shapes differ");
    if (!r.metadata_only) {
      count(different, different == 1 ? "tensor's values differ" : "tensors' values differ");
      count(not_compared - shapes, "not compared");
    }
    count(r.entries.size(), r.entries.size() == 1 ? "entry differs" : "entries differ");
  }
  std::string a_named = display_name(r.path_a);
  if (!r.edits_a.empty()) {
    a_named += " (keys edited:";
    for (const std::string& e : r.edits_a) a_named += " " + escape_controls(e);
    a_named += ")";
  }
  std::cout << a_named << " vs " << display_name(r.path_b) << ": " << (same ? "equivalent" : "DIFFERENT");
  std::string detail;
  for (const std::string& p : parts) detail += (detail.empty() ? "" : ", ") + p;
  if (r.metadata_only) detail += std::string(detail.empty() ? "" : "; ") + "metadata only";
  else if (o.atol != 0 || o.rtol != 0)
    detail += "; atol " + number_text(o.atol) + ", rtol " + number_text(o.rtol);
  if (!detail.empty()) std::cout << " (" << detail << ")";
  std::cout << "\n";

  for (const std::string& k : r.only_in_a) std::cout << "  only in A: " << display_name(k) << "\n";
  for (const std::string& k : r.only_in_b) std::cout << "  only in B: " << display_name(k) << "\n";
  if (!r.renamed.empty()) {
    std::cout << "  renamed: B's keys are A's with " << escape_controls(r.rename_edit) << " (" << r.renamed.size()
              << (r.renamed.size() == 1 ? " key" : " keys") << ")\n";
    for (const auto& [ka, kb] : r.renamed) std::cout << "    " << display_name(ka) << " -> " << display_name(kb) << "\n";
  }
  for (const ckpt::tensor_diff& t : r.tensors) {
    const std::string key = t.key_a == t.key_b ? display_name(t.key_a) : display_name(t.key_a) + " / " + display_name(t.key_b);
    if (t.dtype_differs()) std::cout << "  dtype: " << key << ": " << ckpt::name(t.type_a) << " vs " << ckpt::name(t.type_b) << "\n";
    if (t.shape_differs())
      std::cout << "  shape: " << key << ": " << shape_text(t.shape_a) << " vs " << shape_text(t.shape_b) << "\n";
    switch (t.values) {
      case ckpt::value_verdict::identical: break;
      case ckpt::value_verdict::not_compared:
        if (!t.shape_differs() && !r.metadata_only)
          std::cout << "  not compared: " << key << ": " << escape_controls(t.not_compared_reason) << "\n";
        break;
      case ckpt::value_verdict::equal:
        std::cout << "  equal: " << key << ": " << t.bits_differ << " of " << t.elements
                  << " elements differ in bits, not in value (-0.0 and 0.0, NaN payloads, or a dtype change)\n";
        break;
      case ckpt::value_verdict::close:
      case ckpt::value_verdict::different:
        std::cout << "  " << (t.values == ckpt::value_verdict::close ? "close" : "values") << ": " << key << ": ";
        if (t.values == ckpt::value_verdict::different)
          std::cout << t.outside << " of " << t.elements << " elements outside tolerance (first at index "
                    << *t.first_outside << "), ";
        else
          std::cout << t.not_equal << " of " << t.elements << " elements not equal, all within tolerance, ";
        std::cout << "max abs error " << number_text(t.max_abs_error) << ", max rel error "
                  << number_text(t.max_rel_error);
        if (t.nan_mismatches) std::cout << ", " << t.nan_mismatches << " NaN mismatches";
        std::cout << "\n";
        break;
    }
  }
  for (const ckpt::entry_diff& e : r.entries) {
    std::cout << "  entry: " << display_name(e.path) << ": ";
    auto side = [](const std::optional<ckpt::entry_value>& s) {
      return s ? escape_controls(s->type) + " " + escape_controls(s->value) : std::string("(absent)");
    };
    std::cout << side(e.a) << " vs " << side(e.b) << "\n";
  }
  if (r.entries_elided)
    std::cout << "  note: " << r.entries_elided
              << " entries are equal as far as their shortened rendering shows; not compared in full\n";
}

int run_diff(const diff_cli_options& given) {
  diff_cli_options o = given;
  o.a = ckpt::resolve_checkpoint_path(given.a);
  o.b = ckpt::resolve_checkpoint_path(given.b);
  ckpt::output_set inputs;  // no outputs: refuses a FIFO and sees a file change under the diff
  add_checkpoint_inputs(inputs, o.a);
  add_checkpoint_inputs(inputs, o.b);
  o.diff.edit_a = key_ops_in_order(o.edits, {}, o.reader, code_options{});
  progress_bar bar("diff");
  o.diff.progress = [&bar](uint64_t d, uint64_t t) { bar.update(d, t); };
  const ckpt::diff_report r = ckpt::diff_checkpoints(o.a, o.b, o.diff, o.reader);
  bar.finish();
  for (const std::string& e : r.unused_edits_a)
    spdlog::warn("{} changed no key of A (a typo?)", ckpt::escape_controls(e));
  // A verdict on bytes that changed under the comparison is a verdict on no file at all.
  inputs.check_inputs_unchanged();
  if (o.json)
    std::cout << ckpt::json_text(report_json(r, o.diff)) << "\n";
  else
    print_text(r, o.diff);
  return r.equivalent() ? 0 : ckpt::exit_code(ckpt::errc::check_failed);
}

}  // namespace

verb setup_diff(CLI::App& app) {
  auto o = std::make_shared<diff_cli_options>();
  CLI::App* cmd = app.add_subcommand(
      "diff", "Compare two checkpoints in any formats: keys, wrapper renames, dtypes, shapes, values and entries "
              "(exit 0 if equivalent, 1 if not)");
  cmd->add_option("A", o->a, "A checkpoint: file, shard set (its index or directory) or DCP directory")->required();
  cmd->add_option("B", o->b, "The checkpoint to compare it with (the reference of --rtol)")->required();
  cmd->add_option("--atol", o->diff.atol, "Absolute tolerance, as torch.allclose's (default 0: values must be equal)")
      ->check(tolerance());
  cmd->add_option("--rtol", o->diff.rtol, "Relative tolerance, of |B|, as torch.allclose's (default 0)")
      ->check(tolerance());
  cmd->add_flag("--equal-nan", o->diff.equal_nan, "NaN compares equal to NaN (bit-identical values always do)");
  cmd->add_flag("--metadata-only", o->diff.metadata_only, "Compare keys, dtypes, shapes and entries; read no tensor data");
  cmd->add_flag("--ignore-entries", o->diff.ignore_entries, "Do not compare non-tensor entries (epoch, hyper-parameters, optimizer state)");
  cmd->add_flag("--ignore-metadata", o->diff.ignore_metadata,
                 "Do not compare safetensors __metadata__ maps (ckptool convert writes format: pt)");
  cmd->add_flag("--json", o->json, "Print the result as JSON (docs/diff-json.md)");
  add_key_edit_flags(*cmd, o->edits, "Edits of A's keys before pairing (as rekey's, in the order given)",
                     /*with_match=*/false);
  add_reader_flags(*cmd, o->reader);
  return {cmd, [o] { return run_diff(*o); }};
}

}  // namespace cli
