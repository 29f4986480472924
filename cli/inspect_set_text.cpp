// The text form of `inspect` for a checkpoint of several files (a DCP directory): the
// files, then the state dict by key, each key with its global shape and, with --chunks,
// the boxes it is assembled from and the byte ranges they come from.
#include <algorithm>
#include <array>
#include <iomanip>
#include <map>

#include "base/text.h"
#include "base/text_escape.h"
#include "ckpt/dcp.h"
#include "ckpt/report.h"
#include "ckpt/wrappers.h"
#include "common.h"
#include "inspect_text.h"
#include "text_table.h"

namespace cli {
namespace {

using ckpt::display_name;
using ckpt::escape_controls;

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

uint64_t key_numel(const ckpt::checkpoint& c, size_t k) {
  uint64_t n = 1;
  for (int64_t d : c.keys.shape(k, c.tensors)) n *= uint64_t(std::max<int64_t>(d, 0));
  return n;
}

uint64_t key_bytes(const ckpt::checkpoint& c, size_t k) {
  const ckpt::dtype t = c.keys.type(k, c.tensors);
  const uint64_t per_byte = ckpt::elements_per_byte(t), n = key_numel(c, k);
  return per_byte > 1 ? (n + per_byte - 1) / per_byte : n * ckpt::element_size(t);
}

// "(3, 0)+(2, 4) in __1_0.distcp, data [2281, 2313)" or "... archive [1577, 3154)".
std::string piece_text(const ckpt::checkpoint& c, const ckpt::tensor_piece& p) {
  const ckpt::tensor_record& t = c.tensors[p.tensor];
  std::vector<int64_t> offsets = p.offsets;
  offsets.resize(t.shape.size(), 0);
  std::string out = "offsets " + ckpt::dcp::format_shape(offsets) + ", sizes " +
                    ckpt::dcp::format_shape(std::vector<int64_t>(t.shape.begin(), t.shape.end()));
  if (!t.storage) return out;
  const ckpt::storage_record& s = c.storages[*t.storage];
  const ckpt::source_file& f = c.files[s.file];
  out += " in " + display_name(base_name(f.path));
  if (f.within) out += " (archive at byte " + std::to_string(f.offset_within) + ", decompressed)";
  if (s.file_offset)
    out += std::string(s.archive_range ? ", its archive at bytes [" : ", data at bytes [") +
           std::to_string(*s.file_offset) + ", " + std::to_string(*s.file_offset + s.nbytes) + ")";
  return out;
}

}  // namespace

void print_set_text(std::ostream& out, const ckpt::checkpoint& c, const text_options& options) {
  size_t own_files = 0;
  for (const auto& f : c.files) own_files += !f.within;
  out << display_name(c.path) << ": " << ckpt::layout_name(c.layout);
  // HuggingFaceStorageWriter's pieces (formats.md §9.10): DCP, but safetensors files, no .metadata.
  const bool pieces = c.layout == ckpt::checkpoint_layout::dcp && c.format == ckpt::file_format::safetensors;
  if (c.layout == ckpt::checkpoint_layout::dcp)
    out << " (torch.distributed.checkpoint" << (pieces ? ", safetensors pieces" : "")
        << (c.lightning ? ", with Lightning's meta.pt" : "");
  if (!c.writer.empty()) out << ", version " << escape_controls(c.writer);
  if (c.layout == ckpt::checkpoint_layout::dcp) out << ")";
  out << ", " << human_bytes(c.file_size()) << " in " << own_files << (own_files == 1 ? " file" : " files") << "\n";
  if (!c.index_path.empty()) out << "  index " << display_name(c.index_path) << "\n";
  for (const auto& f : c.files)
    if (!f.within) out << "  file " << display_name(f.path) << ": " << human_bytes(f.size) << "\n";
  if (own_files != c.files.size())
    out << "  (" << c.files.size() - own_files << (c.files.size() - own_files == 1 ? " archive" : " archives")
        << " inside them opened: one per chunk or value read)\n";

  // Keys, as the filter keeps them.
  std::vector<size_t> shown;
  for (size_t k = 0; k < c.keys.size(); ++k)
    if (key_matches(options.filter, std::string(c.keys.key(k)))) shown.push_back(k);
  size_t assembled = 0;
  uint64_t numel = 0, bytes = 0;
  std::map<std::string, std::array<uint64_t, 2>> by_dtype;
  for (size_t k : shown) {
    assembled += c.keys.piece_count(k) != 1 || !c.keys.piece(k, 0).offsets.empty();
    numel += key_numel(c, k);
    bytes += key_bytes(c, k);
    auto& row = by_dtype[ckpt::name(c.keys.type(k, c.tensors))];
    row[0] += 1;
    row[1] += key_bytes(c, k);
  }
  out << "state dict: " << c.keys.size() << (c.keys.size() == 1 ? " tensor" : " tensors");
  if (c.layout == ckpt::checkpoint_layout::dcp)
    out << " (" << assembled << " assembled from chunks), from " << c.tensors.size() << " chunk"
        << (c.tensors.size() == 1 ? "" : "s");
  out << "\n";

  auto wrappers = ckpt::count_wrappers(ckpt::tensor_keys(c));
  if (!wrappers.empty()) {
    out << "wrapper segments:\n";
    for (auto& [segment, count] : wrappers)
      out << "  " << std::left << std::setw(30) << segment << std::right << std::setw(7) << count << " keys\n";
    if (wrappers.count("_orig_mod.")) out << "  ('_orig_mod.' comes from torch.compile)\n";
  }

  if (!shown.empty()) {
    size_t w[4] = {3, 5, 5, 5};
    std::vector<std::array<std::string, 5>> rows;
    rows.reserve(shown.size());
    for (size_t k : shown) {
      const size_t n = c.keys.piece_count(k);
      const bool whole = n == 1 && c.keys.piece(k, 0).offsets.empty();
      std::string notes;
      if (!whole) notes = std::to_string(n) + (n == 1 ? " chunk" : " chunks");
      const auto& shape = c.keys.shape(k, c.tensors);
      rows.push_back({display_name(c.keys.key(k)), ckpt::name(c.keys.type(k, c.tensors)), shape_text(shape),
                      human_bytes(key_bytes(c, k)), notes});
      const auto& r = rows.back();
      w[0] = std::max(w[0], std::min<size_t>(r[0].size(), 72));
      for (int i = 1; i < 4; ++i) w[i] = std::max(w[i], r[size_t(i)].size());
    }
    table_lines lines(out);
    auto line = [&](const std::array<std::string, 5>& r) {
      lines.text("  ").left(r[0], w[0]).text("  ").left(r[1], w[1]).text("  ").left(r[2], w[2]).text("  ");
      lines.right(r[3], w[3]);
      if (!r[4].empty()) lines.text("  ").text(r[4]);
      lines.end_line();
    };
    lines.end_line();
    line({"KEY", "DTYPE", "SHAPE", "BYTES", "NOTES"});
    for (size_t i = 0; i < shown.size(); ++i) {
      line(rows[i]);
      if (options.chunks)
        for (size_t p = 0; p < c.keys.piece_count(shown[i]); ++p) {
          lines.text("      ").text(piece_text(c, c.keys.piece(shown[i], p)));
          lines.end_line();
        }
    }
    lines.flush();
    // The stream's alignment as the manipulators this replaced left it.
    out.setf(std::ios::right, std::ios::adjustfield);
  }

  out << "\ntotals";
  if (!options.filter.empty()) out << " of the tensors matching --filter";
  out << ": " << shown.size() << " tensors, " << with_commas(numel) << " elements, " << human_bytes(bytes) << "\n";
  for (auto& [dt, v] : by_dtype)
    out << "  " << std::left << std::setw(16) << dt << std::right << std::setw(8) << v[0] << " tensors  "
        << human_bytes(v[1]) << "\n";

  if (!c.entries.empty()) {
    out << "\nentries (non-tensor values; torch.load(weights_only=False) loads them):\n";
    for (const auto& e : c.entries)
      out << "  " << std::left << std::setw(32) << display_name(ckpt::path_to_string(e.path)) << " " << std::setw(12)
          << escape_controls(e.type) << " " << escape_controls(e.value) << "\n";
  }
  if (!c.warnings.empty()) {
    out << "\nwarnings:\n";
    for (const auto& w : c.warnings) out << "  " << escape_controls(w) << "\n";
  }
  out << "\n";
  if (c.layout == ckpt::checkpoint_layout::dcp && c.format == ckpt::file_format::safetensors) {
    out << "unsafe globals: none (safetensors files hold no code)\n";
  } else if (c.unsafe_globals.empty()) {
    out << "unsafe globals: none (.metadata holds only DCP's own classes; its values' pickles only what "
           "torch.load(weights_only=True) accepts)\n";
  } else {
    out << "UNSAFE globals (torch.load(weights_only=False), which DCP uses for non-tensor values, would import and may "
           "run them):\n";
    for (const auto& g : c.unsafe_globals) out << "  " << display_name(g) << "\n";
  }
  if (!options.chunks && c.layout == ckpt::checkpoint_layout::dcp && c.format != ckpt::file_format::safetensors)
    out << "(read from .metadata alone; --chunks opens every chunk and lists where each one's data lies)\n";
}

}  // namespace cli
