#include "pt2_fill_cli.h"

#include <chrono>
#include <iomanip>
#include <iostream>

#include <nlohmann/json.hpp>

#include "base/text_escape.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "ckpt/pt2_fill.h"
#include "ckpt/report.h"
#include "common.h"

namespace cli {
namespace {

void print_list(std::ostream& out, const char* title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  out << title << " (" << items.size() << "):\n";
  for (size_t i = 0; i < items.size() && i < 20; ++i) out << "  " << ckpt::display_name(items[i]) << "\n";
  if (items.size() > 20) out << "  ... " << items.size() - 20 << " more\n";
}

}  // namespace

std::optional<ckpt::checkpoint> open_exported_program(const std::string& path, const ckpt::open_options& reader) {
  ckpt::checkpoint ep = ckpt::open_checkpoint(path, reader);
  if (ep.format != ckpt::file_format::pt2 || !ep.pt2) return std::nullopt;
  return ep;
}

int materialize_exported_program(ckpt::output_set& set, const ckpt::checkpoint& c, const ckpt::checkpoint& ep,
                                 const pt2_fill_args& a, std::ostream& report) {
  const auto start = std::chrono::steady_clock::now();
  ckpt::pt2::fill_plan plan;
  try {
    plan = ckpt::pt2::plan_fill(c, ep, a.strict);
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
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (a.json) {
    nlohmann::json doc;
    doc["checkpoint"] = a.checkpoint;
    doc["model"] = a.model;
    doc["device"] = "cpu";
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
    doc["output"] = a.out ? nlohmann::json(a.output) : nlohmann::json(nullptr);
    report << ckpt::json_text(doc) << "\n";
  } else {
    report << "filled " << plan.filled.size() << " tensors of " << ckpt::display_name(a.model) << " ("
           << human_bytes(plan.bytes) << ") in " << std::fixed << std::setprecision(3) << seconds << " s"
           << (plan.meta_export ? " (an archive exported on the meta device: new weight files)" : "") << "\n";
    report << "key edit: " << ckpt::escape_controls(plan.key_edit) << "\n";
    print_list(report, "kept from the archive (not in the checkpoint, --no-strict)", plan.kept);
    print_list(report, "from the archive (constants and entries no state dict holds)", plan.from_archive);
    print_list(report, "not used by the archive", plan.unexpected);
    if (a.out) report << "wrote " << ckpt::display_name(a.output) << "\n";
  }
  return 0;
}

}  // namespace cli
