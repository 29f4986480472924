#include "aoti_cli.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "base/text.h"
#include "base/text_escape.h"
#include "ckpt/error.h"
#include "ckpt/report.h"
#include "common.h"
#include "formats/pt2_archive.h"

namespace cli {
namespace {

using namespace ckpt::aoti;

const char* kLiteralRule =
    "parameters and buffers of the exported program that are not in this table cannot be swapped: Inductor compiled "
    "0-d tensors and 1-D tensors of at most 8 elements into the code as literals (unless compiled with "
    "always_keep_tensor_constants=True), and dropped unused ones";

std::string place_text(const model& m) {
  switch (m.weights) {
    case weights_place::in_so: return "in the model library (.so)";
    case weights_place::blob: return "in " + m.blob_record;
    case weights_place::pickle_files: return "in data/weights/ (torch.save files, " + m.weights_config_record + ")";
    case weights_place::none: break;
  }
  return "none in the package (they must be loaded before it runs)";
}

// "s77 in 2..1024" or "8".
std::string dim_text(const input_dim& d) {
  if (d.size) return std::to_string(*d.size);
  std::string s = d.symbol.empty() ? "?" : d.symbol;
  if (d.min || d.max)
    s += " in " + (d.min ? std::to_string(*d.min) : std::string("..")) + ".." + (d.max ? std::to_string(*d.max) : std::string(""));
  return s;
}

bool keeps_small_constants(const model& m) {
  for (const auto& c : m.constants)
    if (c.shape.empty() || (c.shape.size() == 1 && c.shape[0] <= 8)) return true;
  return false;
}

nlohmann::json spec_json(const std::string& s) {
  if (s.empty()) return nullptr;
  auto j = nlohmann::json::parse(s, nullptr, false);
  return j.is_discarded() ? nlohmann::json(s) : j;
}

nlohmann::json model_json(const model& m) {
  nlohmann::json j;
  j["name"] = m.name;
  j["device"] = m.device;
  j["metadata"] = m.metadata;
  j["isa_missing"] = m.isa_missing;
  j["weights"] = place_name(m.weights);
  j["include_weights"] = m.include_weights;
  j["warnings"] = m.warnings;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : m.files) files.push_back({{"record", f.record}, {"size", f.size}, {"role", f.role}});
  j["files"] = std::move(files);
  nlohmann::json cs = nlohmann::json::array();
  uint64_t reserved = 0;
  for (size_t i = 0; i < m.constants.size(); ++i) {
    const constant& c = m.constants[i];
    if (!c.from_folded) reserved += c.data_size;
    cs.push_back({{"index", i},
                  {"name", c.name},
                  {"fqn", c.original_fqn},
                  {"dtype", c.dtype_text},
                  {"shape", c.shape},
                  {"stride", c.stride},
                  {"offset", c.offset},
                  {"data_size", c.data_size},
                  {"kind", kind_name(c.kind)},
                  {"from_folded", c.from_folded},
                  {"device", c.device.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.device)},
                  {"layout", c.strided ? "strided" : "opaque"}});
  }
  j["constants"] = std::move(cs);
  j["constants_bytes"] = reserved;
  nlohmann::json ins = nlohmann::json::array();
  for (const auto& in : m.inputs) {
    nlohmann::json dims = nlohmann::json::array();
    for (const auto& d : in.dims) {
      nlohmann::json x = {{"dim", d.dim}};
      if (d.size) x["size"] = *d.size;
      if (d.min) x["min"] = *d.min;
      if (d.max) x["max"] = *d.max;
      if (!d.symbol.empty()) x["symbol"] = d.symbol;
      dims.push_back(std::move(x));
    }
    nlohmann::json strides = nlohmann::json::array();
    for (const auto& s : in.strides) strides.push_back(s ? nlohmann::json(*s) : nlohmann::json(nullptr));
    ins.push_back({{"name", in.name},
                   {"dtype", in.dtype_text.empty() ? nlohmann::json(nullptr) : nlohmann::json(in.dtype_text)},
                   {"dims", std::move(dims)},
                   {"strides", std::move(strides)},
                   {"device", in.device.empty() ? nlohmann::json(nullptr) : nlohmann::json(in.device)}});
  }
  j["inputs"] = std::move(ins);
  j["outputs"] = m.output_names;
  j["in_spec"] = spec_json(m.in_spec);
  j["out_spec"] = spec_json(m.out_spec);
  j["not_swappable"] = {{"rule", kLiteralRule},
                        {"config", "always_keep_tensor_constants=True"},
                        {"keeps_small_constants", keeps_small_constants(m)}};
  return j;
}

void print_model(std::ostream& out, const model& m) {
  auto meta = [&](const char* k) {
    auto it = m.metadata.find(k);
    return it == m.metadata.end() ? std::string() : ckpt::escape_controls(it->second);
  };
  out << "model '" << ckpt::escape_controls(m.name) << "': " << ckpt::escape_controls(m.device) << ", " << meta("AOTI_PLATFORM")
      << " " << meta("AOTI_MACHINE");
  if (!meta("AOTI_CPU_ISA").empty()) out << ", CPU ISA " << meta("AOTI_CPU_ISA");
  if (!meta("AOTI_COMPUTE_CAPABILITY").empty()) out << ", compute capability " << meta("AOTI_COMPUTE_CAPABILITY");
  out << "\n  weights: " << ckpt::escape_controls(place_text(m)) << "\n";
  for (const auto& w : m.warnings) out << "  warning: " << ckpt::escape_controls(w) << "\n";
  out << "  files:\n";
  for (const auto& f : m.files)
    out << "    " << ckpt::display_name(f.record) << "  " << human_bytes(f.size) << "  " << f.role << "\n";
  out << "  constants (" << m.constants.size() << "):\n";
  for (size_t i = 0; i < m.constants.size(); ++i) {
    const constant& c = m.constants[i];
    out << "    " << i << "  " << ckpt::display_name(c.original_fqn.empty() ? "(no fqn)" : c.original_fqn) << "  "
        << kind_name(c.kind) << "  " << ckpt::escape_controls(c.dtype_text) << " " << ckpt::text::shape(c.shape)
        << " stride " << ckpt::text::shape(c.stride);
    if (c.offset) out << " offset " << c.offset;
    out << "  " << c.data_size << " B  (" << ckpt::escape_controls(c.name) << ")";
    if (c.from_folded) out << "  folded";
    if (!c.strided) out << "  opaque layout";
    out << "\n";
  }
  out << "  inputs (" << m.inputs.size() << "):\n";
  for (const auto& in : m.inputs) {
    out << "    " << in.index << " " << ckpt::escape_controls(in.name) << ": "
        << (in.dtype_text.empty() ? std::string("?") : ckpt::escape_controls(in.dtype_text)) << " [";
    for (size_t d = 0; d < in.dims.size(); ++d) out << (d ? ", " : "") << ckpt::escape_controls(dim_text(in.dims[d]));
    out << "]";
    if (!in.device.empty()) out << " on " << in.device;
    out << "\n";
  }
  out << "  outputs (" << m.output_names.size() << "):";
  for (const auto& o : m.output_names) out << " " << ckpt::escape_controls(o);
  out << "\n  in_spec:  " << ckpt::escape_controls(m.in_spec.substr(0, 300)) << "\n  out_spec: "
      << ckpt::escape_controls(m.out_spec.substr(0, 300)) << "\n";
  out << "  not swappable: " << kLiteralRule << "\n";
}

// Whether the first record's name is one a pt2 writer puts first (its data/ folder or its
// small fixed records): a cheap look at 30 bytes and a name, so that every other zip is
// not opened twice (its central directory may list a million records).
bool first_record_may_be_pt2(const ckpt::byte_source& src) {
  uint8_t head[30];
  if (src.size() < sizeof head) return false;
  src.read_exact(0, head, sizeof head);
  if (head[0] != 'P' || head[1] != 'K' || head[2] != 3 || head[3] != 4) return false;
  const size_t n = size_t(head[26]) | size_t(head[27]) << 8;
  if (n == 0 || src.size() < sizeof head + n) return false;
  std::string name(n, '\0');
  src.read_exact(sizeof head, name.data(), n);
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return false;
  const std::string rest = name.substr(slash + 1);
  for (const char* p : {"data/", "archive_format", "archive_version", "byteorder", ".data/", "models/", "extra/"})
    if (rest.rfind(p, 0) == 0) return rest != "data.pkl";
  return false;
}

}  // namespace

bool is_aoti_package_file(const std::string& path) {
  try {
    ckpt::file_source src(path);
    if (!first_record_may_be_pt2(src)) return false;
    auto ar = ckpt::zip::archive::open(src);
    return ckpt::aoti::is_aoti_package(*ar);
  } catch (const ckpt::error&) {
    return false;
  }
}

bool is_pt2_archive_file(const std::string& path) {
  try {
    ckpt::file_source src(path);
    if (!first_record_may_be_pt2(src)) return false;
    auto ar = ckpt::zip::archive::open(src);
    return ckpt::detail::has_pt2_format_record(*ar);
  } catch (const ckpt::error&) {
    return false;
  }
}

aoti_opened open_aoti_package(const std::string& path) {
  aoti_opened o;
  try {
    o.source = std::make_unique<ckpt::file_source>(path);
    o.archive = ckpt::zip::archive::open(*o.source);
    o.package = ckpt::aoti::read_package(*o.archive);
  } catch (ckpt::error& e) {
    e.with_file(path);
    throw;
  }
  return o;
}

int inspect_aoti(const std::string& path, bool json, bool pretty) {
  aoti_opened o = open_aoti_package(path);
  if (json) {
    nlohmann::json doc;
    doc["schema"] = 1;
    doc["ckptool_version"] = CKPTOOL_VERSION;
    doc["file"] = path;
    doc["format"] = "aoti-package";
    doc["file_size"] = o.source->size();
    doc["root"] = o.package.root;
    doc["archive_version"] = o.package.archive_version;
    doc["bytes_read"] = o.source->bytes_read();
    nlohmann::json models = nlohmann::json::array();
    for (const auto& m : o.package.models) models.push_back(model_json(m));
    doc["models"] = std::move(models);
    std::cout << ckpt::json_text(doc, pretty || stdout_is_terminal() ? 2 : -1) << "\n";
  } else {
    std::cout << ckpt::display_name(path) << ": AOTInductor package (pt2 archive_version " << o.package.archive_version
              << "), " << human_bytes(o.source->size()) << ", " << o.package.models.size() << " model"
              << (o.package.models.size() == 1 ? "" : "s") << "\n";
    for (const auto& m : o.package.models) print_model(std::cout, m);
    std::cout << "(metadata only: the model library was not loaded; materialize --model runs it)\n";
  }
  if (!flush_stdout()) throw ckpt::error(ckpt::errc::io, "cannot write to standard output");
  return 0;
}

int verify_aoti(const std::string& path, bool json) {
  aoti_opened o = open_aoti_package(path);
  std::vector<std::string> notes;
  std::vector<std::string> problems = ckpt::aoti::check_package(*o.archive, o.package, &notes);
  uint64_t checked = 0, without = 0, bytes = 0;
  for (const auto& e : o.archive->entries()) {
    ckpt::zip::crc_result r = o.archive->record_crc(e);
    if (r.outcome == ckpt::zip::crc_outcome::mismatch)
      problems.push_back("record " + std::string(e.record) + ": CRC-32 mismatch (byte " + std::to_string(e.data_offset) + ")");
    else if (r.outcome == ckpt::zip::crc_outcome::not_recorded)
      ++without;
    else
      ++checked;
    bytes += e.compressed_size;
  }
  size_t constants = 0;
  for (const auto& m : o.package.models) {
    constants += m.constants.size();
    for (const auto& w : m.warnings) notes.push_back("model '" + m.name + "': " + w);
  }
  const bool ok = problems.empty();
  if (json) {
    nlohmann::json doc = {{"file", path},
                          {"ok", ok},
                          {"format", "aoti-package"},
                          {"layout", nullptr},
                          {"files", 1},
                          {"tensors", constants},
                          {"records_checked", checked},
                          {"records_without_crc", without},
                          {"bytes_checked", bytes},
                          {"problems", problems},
                          {"notes", notes},
                          {"unsafe_globals", nlohmann::json::array()}};
    std::cout << ckpt::json_text(doc) << "\n";
  } else {
    std::cout << ckpt::display_name(path) << ": " << (ok ? "OK" : "FAILED") << " (AOTInductor package, "
              << o.package.models.size() << " model" << (o.package.models.size() == 1 ? "" : "s") << ", " << constants
              << " constants, " << checked << " records' CRC checked, " << human_bytes(bytes) << ")\n";
    for (const auto& p : problems) std::cout << "  problem: " << ckpt::escape_controls(p) << "\n";
    for (const auto& n : notes) std::cout << "  note: " << ckpt::escape_controls(n) << "\n";
  }
  return ok ? 0 : ckpt::exit_code(ckpt::errc::check_failed);
}

}  // namespace cli
