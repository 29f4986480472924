// Rank-local metadata (docs/formats.md §9.8): dcp.save(use_collectives=False), PyTorch
// 2.9+, has every rank plan and finish alone (state_dict_saver.py _save_state_dict: the
// "global" plan of one local plan), so each rank writes `__{rank}.metadata` listing only
// the items it wrote itself, into its own `__{rank}_N.distcp` files (filesystem.py
// prepare_local_plan, finish). dcp.load then reads only the loading rank's file
// (state_dict_loader.py, the fallback to read_metadata(rank=...)). One view of the whole
// checkpoint is the union of the files: they must agree on what each key is, and a box
// more than one rank wrote (a replicated tensor, a BYTE_IO value: no dedup runs without
// the collective) is kept once, its other copies listed for the reader to compare.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "ckpt/dcp.h"
#include "ckpt/error.h"

namespace ckpt::dcp {
namespace {

[[noreturn]] void disagree(const std::string& file, const std::string& what, std::optional<uint64_t> at) {
  throw error(errc::corrupt, what, at).with_file(file);
}

bool same_path(const planner_path& a, const planner_path& b) {
  if (a.path.size() != b.path.size()) return false;
  for (size_t i = 0; i < a.path.size(); ++i)
    if (a.path[i].is_index != b.path[i].is_index || a.path[i].key != b.path[i].key || a.path[i].index != b.path[i].index)
      return false;
  return true;
}

}  // namespace

std::optional<uint32_t> rank_local_metadata_rank(std::string_view name) {
  constexpr std::string_view head = "__", tail = ".metadata";
  if (name.size() <= head.size() + tail.size() || name.substr(0, 2) != head ||
      name.substr(name.size() - tail.size()) != tail)
    return std::nullopt;
  std::string_view digits = name.substr(2, name.size() - 2 - tail.size());
  // The writer formats an int: no sign, no leading zero, and no rank past 2^31.
  if (digits.size() > 10 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  uint64_t r = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    r = r * 10 + uint64_t(c - '0');
  }
  if (r > uint64_t(INT32_MAX)) return std::nullopt;
  return uint32_t(r);
}

metadata merge_rank_local(std::vector<metadata> ranks, const std::vector<std::string>& names) {
  metadata out;
  out.sources = names;
  std::map<std::string, size_t> item_at;        // fqn -> index in out.items
  std::map<std::string, size_t> planned_at;     // fqn -> index in out.planner_data
  std::map<std::tuple<std::string, bool, std::vector<int64_t>>, size_t> stored;  // -> out.storage_data
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    metadata& md = ranks[r];
    const std::string& file = names.at(r);
    for (auto& s : md.storage_data) s.source = r;
    for (auto& it : md.items)
      for (auto& c : it.tensor.chunks) c.source = r;
    // Each file alone must be a sound index of its own items before they are pooled.
    try {
      check_storage_index(md);
    } catch (error& e) {
      e.with_file(file);
      throw;
    }
    // The writer names a rank's data files with its own prefix (prepare_local_plan): an
    // entry into another rank's file is no file this save wrote.
    const std::string prefix = "__" + std::to_string(r) + "_";
    for (const auto& s : md.storage_data)
      if (s.relative_path.compare(0, prefix.size(), prefix) != 0)
        disagree(file, "storage_data['" + s.fqn + "'] points into '" + s.relative_path + "', not into this rank's own " +
                           prefix + "N.distcp files",
                 s.at);

    if (r == 0) {
      out.has_planner_data = md.has_planner_data;
      out.planner_data_opaque = md.planner_data_opaque;
      out.writer_meta = md.writer_meta;
      out.version = md.version;
      out.protocol = md.protocol;
    } else {
      if (md.version != out.version)
        disagree(file, "Metadata.version is " + md.version.value_or("absent") + ", rank 0's " +
                           out.version.value_or("absent") + ": the rank files are of different writers",
                 std::nullopt);
      if (md.has_planner_data != out.has_planner_data || md.planner_data_opaque != out.planner_data_opaque)
        disagree(file, "planner_data is of another form than in rank 0's file", std::nullopt);
    }
    for (auto& f : md.unknown_fields)
      if (std::find(out.unknown_fields.begin(), out.unknown_fields.end(), f) == out.unknown_fields.end())
        out.unknown_fields.push_back(f);
    out.globals.insert(out.globals.end(), md.globals.begin(), md.globals.end());

    for (auto& it : md.items) {
      auto [pos, fresh] = item_at.emplace(it.fqn, out.items.size());
      if (fresh) {
        out.items.push_back(std::move(it));
        continue;
      }
      item& have = out.items[pos->second];
      if (have.is_tensor != it.is_tensor)
        disagree(file, "'" + it.fqn + "' is " + (it.is_tensor ? "a tensor" : "a BYTE_IO item") + " here and " +
                           (have.is_tensor ? "a tensor" : "a BYTE_IO item") + " in an earlier rank's file",
                 it.at);
      if (!it.is_tensor) continue;
      if (have.tensor.type != it.tensor.type || have.tensor.size != it.tensor.size)
        disagree(file, "tensor '" + it.fqn + "' is " + name(it.tensor.type) + " " + format_shape(it.tensor.size) +
                           " here and " + name(have.tensor.type) + " " + format_shape(have.tensor.size) +
                           " in an earlier rank's file",
                 it.at);
      for (auto& c : it.tensor.chunks) have.tensor.chunks.push_back(std::move(c));
    }
    for (auto& s : md.storage_data) {
      auto [pos, fresh] = stored.emplace(std::make_tuple(s.fqn, s.offsets.has_value(), s.offsets.value_or(std::vector<int64_t>{})),
                                         out.storage_data.size());
      if (fresh)
        out.storage_data.push_back(std::move(s));
      else
        out.replicas.push_back(std::move(s));
    }
    for (auto& p : md.planner_data) {
      auto [pos, fresh] = planned_at.emplace(p.fqn, out.planner_data.size());
      if (fresh)
        out.planner_data.push_back(std::move(p));
      else if (!same_path(out.planner_data[pos->second], p))
        disagree(file, "planner_data gives '" + p.fqn + "' another nesting path than an earlier rank's file", std::nullopt);
    }
  }
  std::sort(out.globals.begin(), out.globals.end());
  out.globals.erase(std::unique(out.globals.begin(), out.globals.end()), out.globals.end());
  check_metadata(out);
  return out;
}

}  // namespace ckpt::dcp
