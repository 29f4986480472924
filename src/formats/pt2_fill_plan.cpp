// Which checkpoint tensor fills which entry of a torch.export archive, and what the new
// archive's tensor files are (formats.md §14.9). Everything is decided and checked here,
// before an output byte exists: torch.export.load checks nothing of a payload against the
// program, so a wrong dtype or shape would load as garbage.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "base/byteio.h"
#include "base/text.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "ckpt/pt2_fill.h"
#include "ckpt/rekey.h"
#include "formats/pt2_schema.h"
#include "model/assembly.h"
#include "model/plain_tensor.h"
#include "model/row_major.h"

namespace ckpt::pt2 {
namespace {

std::string first_few(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? ", " : "") + text::quote(v[i], 80);
  return v.size() > 6 ? s + ", ... (" + std::to_string(v.size()) + " in all)" : s;
}

// One tensor of the archive the solver may fill.
struct target {
  std::string fqn;
  size_t tensor = 0;          // archive.tensors
  bool constant = false;      // from the constants config
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The next free number of `prefix`<n> among the archive's records under `dir` (the writer
// numbers tensor files across the archive, formats.md §14.2).
size_t next_number(const zip::archive& ar, const std::string& dir, const std::string& prefix) {
  size_t next = 0;
  const std::string head = dir + prefix;
  for (const auto& e : ar.entries()) {
    if (!starts_with(e.record, head)) continue;
    const std::string_view digits = e.record.substr(head.size());
    if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    next = std::max(next, size_t(std::stoul(std::string(digits))) + 1);
  }
  return next;
}

// Elements a view reaches in its file: offset + 1 + sum((size - 1) * stride); 0 when empty.
uint64_t view_extent(const tensor_record& t) {
  uint64_t last = uint64_t(t.storage_offset);
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] == 0) return uint64_t(t.storage_offset);
    uint64_t span;
    if (!checked_mul(uint64_t(t.shape[d] - 1), uint64_t(t.stride[d]), &span) || !checked_add(last, span, &last))
      throw_corrupt("view extent overflows");
  }
  return last + 1;
}

// The refusals convert makes for a tensor it cannot copy as plain bytes.
void check_source(const checkpoint& c, const tensor_record& t, const std::string& key) {
  if (const auto why = detail::not_plain_reason(c, t))
    throw error(errc::unsupported, "checkpoint tensor " + text::quote(key) + " " + *why +
                                       ": an exported program's weights are plain tensors")
        .with_file(c.path);
}

// A JSON record the archive reader has parsed once already (so it exists and is JSON).
detail::pt2s::json parse_record(const zip::archive& ar, const std::string& record) {
  const zip::entry* e = ar.find(record);
  if (!e) throw_corrupt("record " + record + " is missing");
  const auto bytes = ar.read_record(*e);
  return detail::pt2s::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                             detail::pt2s::where{record, e->data_offset});
}

}  // namespace

static fill_plan plan_fill_checked(const checkpoint& ckpt, const checkpoint& archive, bool strict) {
  if (!archive.pt2 || archive.format != file_format::pt2)
    throw error(errc::usage, "--model is not a torch.export archive").with_file(archive.path);
  const archive_info& info = *archive.pt2;
  if (info.models.size() != 1)
    throw error(errc::unsupported, "the archive holds " + std::to_string(info.models.size()) +
                                       " programs; filling takes an archive of one (torch.export.save writes one)")
        .with_file(archive.path);
  if (ckpt.byteorder != "little")
    throw error(errc::unsupported, "a " + ckpt.byteorder + "-endian checkpoint: the archive's payloads are little-endian "
                                   "bytes, copied as they are")
        .with_file(ckpt.path);
  const model& m = info.models[0];
  const std::string context = "cannot fill " + text::quote(archive.path, 200) + " with the checkpoint: ";
  fill_plan plan;
  plan.model = m.name;

  // The archive's tensors by FQN: the weights config's entries (state-dict keys) and the
  // constants config's (path "<constants>/FQN").
  std::vector<target> targets;
  std::vector<keyed_tensor> wanted;
  for (size_t i = 0; i < archive.tensors.size(); ++i) {
    const tensor_record& t = archive.tensors[i];
    target g;
    g.tensor = i;
    if (t.path.empty() || t.path.size() > 2) continue;
    g.constant = t.path.size() == 2;
    const std::string* fqn = std::get_if<std::string>(&t.path.back());
    if (!fqn) continue;
    g.fqn = *fqn;
    wanted.push_back({g.fqn, t.type, std::vector<int64_t>(t.shape.begin(), t.shape.end())});
    targets.push_back(std::move(g));
  }
  std::map<std::string, size_t> target_of;
  for (size_t i = 0; i < targets.size(); ++i) target_of[targets[i].fqn] = i;

  const std::vector<keyed_tensor> have = keyed_tensors(ckpt);
  if (have.empty()) throw error(errc::unsupported, "no state dict found in the checkpoint").with_file(ckpt.path);
  const match_result r = match_keys(have, wanted);
  if (!r.ambiguity.empty())
    throw error(errc::check_failed, context + "ambiguous key alignment, refusing: " + r.ambiguity).with_file(ckpt.path);
  if (!r.shape_mismatches.empty())
    throw error(errc::unsupported, context + "shapes differ from the archive's: " + first_few(r.shape_mismatches))
        .with_file(ckpt.path);
  if (!r.dtype_mismatches.empty())
    throw error(errc::unsupported, context + "dtypes differ from the archive's (no conversion is made): " +
                                       first_few(r.dtype_mismatches))
        .with_file(ckpt.path);
  plan.key_edit = r.edit;
  plan.unexpected = r.unexpected;

  // What the checkpoint does not fill: constants and kept weights come from the archive,
  // unless the archive has no data for them (a meta export).
  std::vector<std::string> missing, no_data;
  for (const std::string& fqn : r.missing) {
    const target& g = targets[target_of.at(fqn)];
    const tensor_record& t = archive.tensors[g.tensor];
    if (!t.storage)
      no_data.push_back(fqn);
    else if (g.constant)
      plan.from_archive.push_back(fqn);
    else
      missing.push_back(fqn);
  }
  if (!no_data.empty())
    throw error(errc::unsupported, context + std::to_string(no_data.size()) +
                                       " tensors have no data in the archive (exported on the meta device) and the "
                                       "checkpoint does not hold them: " + first_few(no_data))
        .with_file(ckpt.path);
  if (!missing.empty()) {
    if (strict)
      throw error(errc::check_failed, context + std::to_string(missing.size()) +
                                          " archive weights are missing from the checkpoint: " + first_few(missing) +
                                          "; --no-strict keeps the archive's values for them")
          .with_file(ckpt.path);
    plan.kept = missing;
  }
  for (const opaque_entry& o : m.opaque) plan.from_archive.push_back(o.fqn + " (" + o.what + ")");

  // The checkpoint tensors used, once per distinct view (tied keys are one source).
  std::map<std::string, size_t> key_index;
  for (size_t k = 0; k < ckpt.keys.size(); ++k) key_index.emplace(std::string(ckpt.keys.key(k)), k);
  using view_id = std::tuple<size_t, int64_t, std::vector<int64_t>, std::vector<int64_t>, dtype>;
  std::map<view_id, size_t> source_of_view;
  std::map<std::string, size_t> source_of_fqn;
  for (const auto& [src, dst] : r.mapping) {
    const size_t k = key_index.at(src);
    convert_tensor t;
    t.source_key = t.name = src;
    t.type = t.source_type = ckpt.keys.type(k, ckpt.tensors);
    const dim_list& shape = ckpt.keys.shape(k, ckpt.tensors);
    t.shape.assign(shape.begin(), shape.end());
    std::optional<view_id> id;
    if (detail::is_assembled(ckpt.keys, k)) {
      t.assembled = k;
    } else {
      const size_t rec = ckpt.keys.tensor(k);
      const tensor_record& tr = ckpt.tensors.at(rec);
      check_source(ckpt, tr, src);
      t.record = rec;
      id = view_id{*tr.storage, tr.storage_offset, t.shape, std::vector<int64_t>(tr.stride.begin(), tr.stride.end()),
                   tr.type};
    }
    uint64_t n = element_size(t.type);
    for (int64_t d : t.shape)
      if (!checked_mul(n, uint64_t(d), &n)) throw error(errc::corrupt, "tensor " + src + ": size overflows").with_file(ckpt.path);
    t.nbytes = t.source_nbytes = n;
    size_t index = plan.sources.tensors.size();
    if (id) {
      auto [it, fresh] = source_of_view.emplace(*id, index);
      if (!fresh) index = it->second;
    }
    if (index == plan.sources.tensors.size()) {
      plan.bytes += n;
      plan.sources.tensors.push_back(std::move(t));
    }
    source_of_fqn[dst] = index;
    plan.filled.emplace_back(dst, src);
  }
  plan.request.to = convert_target::torch;

  // The output files. An archive file with data keeps its record and its bytes outside the
  // filled views; a file with no data (a meta export's: every tensor names one empty file)
  // gives each filled view, or each set of views one checkpoint tensor ties, a file of its own.
  const zip::archive& ar = *archive.files.at(0).zip;
  std::map<size_t, size_t> file_of_storage;
  std::map<std::tuple<bool, size_t, int64_t, std::vector<int64_t>, std::vector<int64_t>>, size_t> file_of_meta_view;
  std::map<std::string, size_t> files_at_index;  // archive record -> files_at entry
  size_t next_weight = next_number(ar, "data/weights/", "weight_");
  size_t next_tensor = next_number(ar, "data/constants/", "tensor_");
  // Per config (weights, constants): fqn -> new path_name for the meta export's entries.
  std::map<std::string, std::string> renamed[2];
  std::set<std::string> emptied;  // records of no-data files whose entries all moved
  // The payload configs, parsed when a meta export's entries must name new files.
  std::optional<detail::pt2s::json> configs[2];
  auto config_record = [&](bool constants) {
    return constants ? "data/constants/" + m.name + "_constants_config.json"
                     : "data/weights/" + m.name + "_weights_config.json";
  };
  auto config = [&](bool constants) -> detail::pt2s::json& {
    auto& doc = configs[constants ? 1 : 0];
    if (!doc) doc = parse_record(ar, config_record(constants));
    return *doc;
  };
  auto place = [&](const std::string& at, size_t file) {
    auto [it, fresh] = files_at_index.emplace(at, plan.files_at.size());
    if (fresh) plan.files_at.push_back({at, {}});
    plan.files_at[it->second].second.push_back(file);
  };
  for (const auto& [fqn, src] : plan.filled) {
    const target& g = targets[target_of.at(fqn)];
    const tensor_record& t = archive.tensors[g.tensor];
    fill_view v;
    v.source = source_of_fqn.at(fqn);
    v.fqn = fqn;
    v.offset = t.storage_offset;
    v.shape.assign(t.shape.begin(), t.shape.end());
    v.stride.assign(t.stride.begin(), t.stride.end());
    if (t.storage) {
      const storage_record& s = archive.storages[*t.storage];
      auto [it, fresh] = file_of_storage.emplace(*t.storage, plan.files.size());
      if (fresh) {
        fill_file f;
        f.record = f.base = std::string(s.record->record);
        f.type = s.type;
        f.nbytes = s.nbytes;
        plan.files.push_back(std::move(f));
        place(plan.files.back().record, it->second);
      }
      auto& views = plan.files[it->second].views;
      const bool same = std::any_of(views.begin(), views.end(), [&](const fill_view& w) {
        return w.source == v.source && w.offset == v.offset && w.shape == v.shape && w.stride == v.stride;
      });
      if (!same) views.push_back(std::move(v));
      continue;
    }
    // No data: the entry's config names an empty file (formats.md §14.3), whose place in
    // the archive the new files take.
    plan.meta_export = true;
    const std::string dir = g.constant ? "data/constants/" : "data/weights/";
    const std::string old = dir + config(g.constant).at("config").at(fqn).at("path_name").get<std::string>();
    const auto key = std::make_tuple(g.constant, v.source, v.offset, v.shape, v.stride);
    auto [it, fresh] = file_of_meta_view.emplace(key, plan.files.size());
    if (fresh) {
      fill_file f;
      f.record = dir + (g.constant ? "tensor_" + std::to_string(next_tensor++) : "weight_" + std::to_string(next_weight++));
      f.type = t.type;
      f.nbytes = view_extent(t) * element_size(t.type);
      f.views.push_back(std::move(v));
      plan.files.push_back(std::move(f));
      place(old, it->second);
    }
    renamed[g.constant ? 1 : 0][fqn] = plan.files[it->second].record.substr(dir.size());
  }

  // A meta export's configs name the new files, on the CPU; its program's devices follow.
  if (plan.meta_export) {
    for (int constants = 0; constants < 2; ++constants) {
      if (renamed[constants].empty()) continue;
      const std::string dir = constants ? "data/constants/" : "data/weights/";
      auto& entries = config(constants).at("config");
      for (const auto& [fqn, file] : renamed[constants]) {
        auto& entry = entries.at(fqn);
        emptied.insert(dir + entry.at("path_name").get<std::string>());
        entry["path_name"] = file;
        entry["tensor_meta"]["device"] = {{"type", "cpu"}, {"index", nullptr}};
      }
      plan.new_text.emplace_back(config_record(constants), config(constants).dump());
    }
    // Every entry naming an emptied file moved (none can stay: a missing no-data tensor is
    // refused above), unless a pickled or script-object entry names it too.
    for (const std::string& rec : emptied) {
      bool named = false;
      for (const opaque_entry& o : m.opaque) named |= o.file == rec;
      if (!named) plan.dropped.push_back(rec);
    }
    detail::pt2s::json prog = parse_record(ar, m.prog.record);
    size_t moved = 0;
    std::vector<detail::pt2s::json*> stack{&prog};
    while (!stack.empty()) {
      detail::pt2s::json* j = stack.back();
      stack.pop_back();
      if (j->is_object()) {
        auto type = j->find("type");
        if (j->size() <= 2 && type != j->end() && *type == "meta" && (j->size() == 1 || j->contains("index"))) {
          *type = "cpu";
          (*j)["index"] = nullptr;
          ++moved;
          continue;
        }
      }
      if (j->is_structured())
        for (auto& child : *j) stack.push_back(&child);
    }
    if (moved) plan.new_text.emplace_back(m.prog.record, prog.dump());
  }
  return plan;
}

fill_plan plan_fill(const checkpoint& ckpt, const checkpoint& archive, bool strict) {
  try {
    return plan_fill_checked(ckpt, archive, strict);
  } catch (const nlohmann::json::exception& e) {
    // The reader checked these records already; a record that still surprises the rewrite
    // is the archive's fault, never a crash.
    throw error(errc::corrupt, std::string("a payload config or program record: ") + e.what()).with_file(archive.path);
  }
}

}  // namespace ckpt::pt2
