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

std::string program_names(const archive_info& info) {
  std::string names;
  for (const model& m : info.models) names += (names.empty() ? "" : ", ") + text::quote(m.name, 80);
  return names;
}

void check_program_name(const checkpoint& archive, const std::string& name) {
  const archive_info& info = *archive.pt2;
  if (std::none_of(info.models.begin(), info.models.end(), [&](const model& m) { return m.name == name; }))
    throw error(errc::usage, "--program " + text::quote(name, 80) + ": the archive's programs are " + program_names(info))
        .with_file(archive.path);
}

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

namespace {

// Every path_name the payload configs of `m` name, as records ("data/weights/weight_0"):
// what filling another program must leave as it is.
void add_named_files(const zip::archive& ar, const model& m, std::map<std::string, std::string>& owner) {
  for (int constants = 0; constants < 2; ++constants) {
    const std::string dir = constants ? "data/constants/" : "data/weights/";
    const auto doc = parse_record(ar, dir + m.name + (constants ? "_constants_config.json" : "_weights_config.json"));
    for (const auto& [fqn, entry] : doc.at("config").items())
      owner.emplace(dir + entry.at("path_name").get<std::string>(), m.name);
  }
}

// Plans the programs one by one into one fill_plan: each program's keys are aligned on
// their own, while the output's files, the checkpoint sources and the new file numbers are
// shared, so a file two filled programs name is one fill_file whose views must agree.
class planner {
 public:
  planner(const checkpoint& ckpt, const checkpoint& archive, bool strict, fill_plan& plan)
      : ckpt_(ckpt), archive_(archive), strict_(strict), plan_(plan), ar_(*archive.files.at(0).zip) {
    for (size_t k = 0; k < ckpt.keys.size(); ++k) key_index_.emplace(std::string(ckpt.keys.key(k)), k);
    next_weight_ = next_number(ar_, "data/weights/", "weight_");
    next_tensor_ = next_number(ar_, "data/constants/", "tensor_");
    plan_.request.to = convert_target::torch;
  }

  // Returns the checkpoint keys this program does not take.
  std::vector<std::string> add(const model& m, bool several) {
    const std::string context = "cannot fill " +
                                (several ? "program " + text::quote(m.name, 80) + " of " : std::string()) +
                                text::quote(archive_.path, 200) + " with the checkpoint: ";
    const std::string shown = m.key_prefix;  // "a/" before every FQN in messages and reports

    // The program's tensors by FQN: the weights config's entries (state-dict keys) and the
    // constants config's (path "<constants>/FQN"), after "<model>" when there are several.
    std::vector<target> targets;
    std::vector<keyed_tensor> wanted;
    for (size_t i = 0; i < archive_.tensors.size(); ++i) {
      const tensor_record& t = archive_.tensors[i];
      size_t head = 0;
      if (several) {
        const std::string* name = t.path.empty() ? nullptr : std::get_if<std::string>(&t.path.front());
        if (!name || *name != m.name) continue;
        head = 1;
      }
      if (t.path.size() <= head || t.path.size() > head + 2) continue;
      target g;
      g.tensor = i;
      g.constant = t.path.size() == head + 2;
      const std::string* fqn = std::get_if<std::string>(&t.path.back());
      if (!fqn) continue;
      g.fqn = *fqn;
      wanted.push_back({g.fqn, t.type, std::vector<int64_t>(t.shape.begin(), t.shape.end())});
      targets.push_back(std::move(g));
    }
    std::map<std::string, size_t> target_of;
    for (size_t i = 0; i < targets.size(); ++i) target_of[targets[i].fqn] = i;

    const match_result r = match_keys(have_, wanted);
    if (!r.ambiguity.empty())
      throw error(errc::check_failed, context + "ambiguous key alignment, refusing: " + r.ambiguity).with_file(ckpt_.path);
    if (!r.shape_mismatches.empty())
      throw error(errc::unsupported, context + "shapes differ from the archive's: " + first_few(r.shape_mismatches))
          .with_file(ckpt_.path);
    if (!r.dtype_mismatches.empty())
      throw error(errc::unsupported, context + "dtypes differ from the archive's (no conversion is made): " +
                                         first_few(r.dtype_mismatches))
          .with_file(ckpt_.path);
    if (!plan_.key_edit.empty()) plan_.key_edit += "; ";
    plan_.key_edit += several ? m.name + ": " + r.edit : r.edit;

    // What the checkpoint does not fill: constants and kept weights come from the archive,
    // unless the archive has no data for them (a meta export).
    std::vector<std::string> missing, no_data;
    for (const std::string& fqn : r.missing) {
      const target& g = targets[target_of.at(fqn)];
      const tensor_record& t = archive_.tensors[g.tensor];
      if (!t.storage)
        no_data.push_back(fqn);
      else if (g.constant)
        plan_.from_archive.push_back(shown + fqn);
      else
        missing.push_back(fqn);
    }
    if (!no_data.empty())
      throw error(errc::unsupported, context + std::to_string(no_data.size()) +
                                         " tensors have no data in the archive (exported on the meta device) and the "
                                         "checkpoint does not hold them: " + first_few(no_data))
          .with_file(ckpt_.path);
    if (!missing.empty()) {
      if (strict_)
        throw error(errc::check_failed, context + std::to_string(missing.size()) +
                                            " archive weights are missing from the checkpoint: " + first_few(missing) +
                                            "; --no-strict keeps the archive's values for them")
            .with_file(ckpt_.path);
      for (const std::string& fqn : missing) plan_.kept.push_back(shown + fqn);
    }
    for (const opaque_entry& o : m.opaque) plan_.from_archive.push_back(shown + o.fqn + " (" + o.what + ")");

    // The checkpoint tensors used, once per distinct view (tied keys are one source, and
    // so is a key two programs take).
    std::map<std::string, size_t> source_of_fqn;
    std::vector<std::pair<std::string, std::string>> filled;
    for (const auto& [src, dst] : r.mapping) {
      source_of_fqn[dst] = source_of(src);
      filled.emplace_back(dst, src);
      plan_.filled.emplace_back(shown + dst, src);
    }

    // The output files. An archive file with data keeps its record and its bytes outside the
    // filled views; a file with no data (a meta export's: every tensor names one empty file)
    // gives each filled view, or each set of views one checkpoint tensor ties, a file of its own.
    std::map<std::tuple<bool, size_t, int64_t, std::vector<int64_t>, std::vector<int64_t>>, size_t> file_of_meta_view;
    // Per config (weights, constants): fqn -> new path_name for the meta export's entries.
    std::map<std::string, std::string> renamed[2];
    // The payload configs, parsed when a meta export's entries must name new files.
    std::optional<detail::pt2s::json> configs[2];
    auto config_record = [&](bool constants) {
      return constants ? "data/constants/" + m.name + "_constants_config.json"
                       : "data/weights/" + m.name + "_weights_config.json";
    };
    auto config = [&](bool constants) -> detail::pt2s::json& {
      auto& doc = configs[constants ? 1 : 0];
      if (!doc) doc = parse_record(ar_, config_record(constants));
      return *doc;
    };
    bool meta = false;
    for (const auto& [fqn, src] : filled) {
      const target& g = targets[target_of.at(fqn)];
      const tensor_record& t = archive_.tensors[g.tensor];
      fill_view v;
      v.source = source_of_fqn.at(fqn);
      v.fqn = shown + fqn;
      v.offset = t.storage_offset;
      v.shape.assign(t.shape.begin(), t.shape.end());
      v.stride.assign(t.stride.begin(), t.stride.end());
      if (t.storage) {
        // By record, not by storage: the reader gives each program its own storages, and a
        // file two programs name must still be written once.
        const storage_record& s = archive_.storages[*t.storage];
        const std::string record(s.record->record);
        auto [it, fresh] = file_of_record_.emplace(record, plan_.files.size());
        if (fresh) {
          fill_file f;
          f.record = f.base = record;
          f.type = s.type;
          f.nbytes = s.nbytes;
          plan_.files.push_back(std::move(f));
          place(record, it->second);
        } else if (plan_.files[it->second].type != t.type) {
          throw error(errc::unsupported, context + "entry " + text::quote(v.fqn, 80) + " reads " + record + " as " +
                                             name(t.type) + ", another program as " + name(plan_.files[it->second].type))
              .with_file(archive_.path);
        }
        auto& views = plan_.files[it->second].views;
        const bool same = std::any_of(views.begin(), views.end(), [&](const fill_view& w) {
          return w.source == v.source && w.offset == v.offset && w.shape == v.shape && w.stride == v.stride;
        });
        if (!same) views.push_back(std::move(v));
        continue;
      }
      // No data: the entry's config names an empty file (formats.md §14.3), whose place in
      // the archive the new files take.
      meta = plan_.meta_export = true;
      const std::string dir = g.constant ? "data/constants/" : "data/weights/";
      const std::string old = dir + config(g.constant).at("config").at(fqn).at("path_name").get<std::string>();
      const auto key = std::make_tuple(g.constant, v.source, v.offset, v.shape, v.stride);
      auto [it, fresh] = file_of_meta_view.emplace(key, plan_.files.size());
      if (fresh) {
        fill_file f;
        f.record = dir + (g.constant ? "tensor_" + std::to_string(next_tensor_++) : "weight_" + std::to_string(next_weight_++));
        f.type = t.type;
        f.nbytes = view_extent(t) * element_size(t.type);
        f.views.push_back(std::move(v));
        plan_.files.push_back(std::move(f));
        place(old, it->second);
      }
      renamed[g.constant ? 1 : 0][fqn] = plan_.files[it->second].record.substr(dir.size());
    }

    // A meta export's configs name the new files, on the CPU; its program's devices follow.
    if (meta) {
      for (int constants = 0; constants < 2; ++constants) {
        if (renamed[constants].empty()) continue;
        const std::string dir = constants ? "data/constants/" : "data/weights/";
        auto& entries = config(constants).at("config");
        for (const auto& [fqn, file] : renamed[constants]) {
          auto& entry = entries.at(fqn);
          emptied_.insert(dir + entry.at("path_name").get<std::string>());
          entry["path_name"] = file;
          entry["tensor_meta"]["device"] = {{"type", "cpu"}, {"index", nullptr}};
        }
        plan_.new_text.emplace_back(config_record(constants), config(constants).dump());
      }
      detail::pt2s::json prog = parse_record(ar_, m.prog.record);
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
      if (moved) plan_.new_text.emplace_back(m.prog.record, prog.dump());
    }
    return r.unexpected;
  }

  // After every program: the emptied files nothing names any more are dropped, and no
  // record the fill rewrites may belong to a program left as it is (`others`: record ->
  // program), whose weights would change under it.
  void finish(const archive_info& info, const std::map<std::string, std::string>& others) {
    for (const fill_file& f : plan_.files)
      if (!f.base.empty())
        if (auto o = others.find(f.record); o != others.end())
          throw error(errc::unsupported, "cannot fill " + text::quote(archive_.path, 200) + ": " + f.record +
                                             " is also a file of program " + text::quote(o->second, 80) +
                                             ", which is not filled (its weights would change); fill both")
              .with_file(archive_.path);
    // Every entry naming an emptied file moved (none can stay: a missing no-data tensor is
    // refused above), unless a pickled or script-object entry, or another program, names it.
    for (const std::string& rec : emptied_) {
      bool named = others.count(rec) > 0;
      for (const model& m : info.models)
        for (const opaque_entry& o : m.opaque) named |= o.file == rec;
      if (!named) plan_.dropped.push_back(rec);
    }
  }

  std::vector<keyed_tensor> have_;

 private:
  // The source index of checkpoint key `src`, added on first use.
  size_t source_of(const std::string& src) {
    if (auto it = source_of_key_.find(src); it != source_of_key_.end()) return it->second;
    const size_t k = key_index_.at(src);
    convert_tensor t;
    t.source_key = t.name = src;
    t.type = t.source_type = ckpt_.keys.type(k, ckpt_.tensors);
    const dim_list& shape = ckpt_.keys.shape(k, ckpt_.tensors);
    t.shape.assign(shape.begin(), shape.end());
    std::optional<view_id> id;
    if (detail::is_assembled(ckpt_.keys, k)) {
      t.assembled = k;
    } else {
      const size_t rec = ckpt_.keys.tensor(k);
      const tensor_record& tr = ckpt_.tensors.at(rec);
      check_source(ckpt_, tr, src);
      t.record = rec;
      id = view_id{*tr.storage, tr.storage_offset, t.shape, std::vector<int64_t>(tr.stride.begin(), tr.stride.end()),
                   tr.type};
    }
    uint64_t n = element_size(t.type);
    for (int64_t d : t.shape)
      if (!checked_mul(n, uint64_t(d), &n)) throw error(errc::corrupt, "tensor " + src + ": size overflows").with_file(ckpt_.path);
    t.nbytes = t.source_nbytes = n;
    size_t index = plan_.sources.tensors.size();
    if (id) {
      auto [it, fresh] = source_of_view_.emplace(*id, index);
      if (!fresh) index = it->second;
    }
    if (index == plan_.sources.tensors.size()) {
      plan_.bytes += n;
      plan_.sources.tensors.push_back(std::move(t));
    }
    source_of_key_[src] = index;
    return index;
  }

  void place(const std::string& at, size_t file) {
    auto [it, fresh] = files_at_index_.emplace(at, plan_.files_at.size());
    if (fresh) plan_.files_at.push_back({at, {}});
    plan_.files_at[it->second].second.push_back(file);
  }

  using view_id = std::tuple<size_t, int64_t, std::vector<int64_t>, std::vector<int64_t>, dtype>;
  const checkpoint& ckpt_;
  const checkpoint& archive_;
  bool strict_;
  fill_plan& plan_;
  const zip::archive& ar_;
  std::map<std::string, size_t> key_index_;
  std::map<view_id, size_t> source_of_view_;
  std::map<std::string, size_t> source_of_key_;
  std::map<std::string, size_t> file_of_record_;
  std::map<std::string, size_t> files_at_index_;  // archive record -> files_at entry
  size_t next_weight_ = 0, next_tensor_ = 0;
  std::set<std::string> emptied_;  // records of no-data files whose entries all moved
};

}  // namespace

static fill_plan plan_fill_checked(const checkpoint& ckpt, const checkpoint& archive, bool strict,
                                   const std::vector<std::string>& programs) {
  if (!archive.pt2 || archive.format != file_format::pt2)
    throw error(errc::usage, "--model is not a torch.export archive").with_file(archive.path);
  const archive_info& info = *archive.pt2;
  // --program names (in the archive's order, once each); none: every program.
  std::vector<const model*> chosen;
  for (const std::string& p : programs) check_program_name(archive, p);
  for (const model& m : info.models)
    if (programs.empty() || std::find(programs.begin(), programs.end(), m.name) != programs.end()) chosen.push_back(&m);
  if (ckpt.byteorder != "little")
    throw error(errc::unsupported, "a " + ckpt.byteorder + "-endian checkpoint: the archive's payloads are little-endian "
                                   "bytes, copied as they are")
        .with_file(ckpt.path);
  fill_plan plan;
  planner p(ckpt, archive, strict, plan);
  p.have_ = keyed_tensors(ckpt);
  if (p.have_.empty()) throw error(errc::unsupported, "no state dict found in the checkpoint").with_file(ckpt.path);
  const bool several = info.models.size() > 1;
  std::optional<std::set<std::string>> unexpected;  // keys no filled program takes
  for (const model* m : chosen) {
    plan.programs.push_back(m->name);
    const std::vector<std::string> u = p.add(*m, several);
    std::set<std::string> here(u.begin(), u.end());
    if (unexpected) {
      std::set<std::string> both;
      for (const std::string& k : *unexpected)
        if (here.count(k)) both.insert(k);
      unexpected = std::move(both);
    } else {
      unexpected = std::move(here);
    }
  }
  for (const keyed_tensor& k : p.have_)  // in the checkpoint's order
    if (unexpected->count(k.key)) plan.unexpected.push_back(k.key);
  std::map<std::string, std::string> others;
  for (const model& m : info.models)
    if (std::find(chosen.begin(), chosen.end(), &m) == chosen.end()) add_named_files(*archive.files.at(0).zip, m, others);
  p.finish(info, others);
  return plan;
}

fill_plan plan_fill(const checkpoint& ckpt, const checkpoint& archive, bool strict,
                    const std::vector<std::string>& programs) {
  try {
    return plan_fill_checked(ckpt, archive, strict, programs);
  } catch (const nlohmann::json::exception& e) {
    // The reader checked these records already; a record that still surprises the rewrite
    // is the archive's fault, never a crash.
    throw error(errc::corrupt, std::string("a payload config or program record: ") + e.what()).with_file(archive.path);
  }
}

std::string program_to_run(const checkpoint& archive, const std::vector<std::string>& requested) {
  if (!archive.pt2 || archive.format != file_format::pt2 || archive.pt2->models.empty())
    throw error(errc::usage, "--model is not a torch.export archive with a program").with_file(archive.path);
  const archive_info& info = *archive.pt2;
  // nativert's runner is handed one name and reads only that program's records (§14.9).
  if (requested.size() > 1)
    throw error(errc::usage, "--run runs one program; --program was given " + std::to_string(requested.size()) +
                                 " times (the archive's programs are " + program_names(info) + ")")
        .with_file(archive.path);
  if (requested.size() == 1) {
    check_program_name(archive, requested[0]);
    return requested[0];
  }
  if (info.models.size() > 1)
    throw error(errc::usage, "--run with an archive of " + std::to_string(info.models.size()) +
                                 " programs needs --program NAME, one of " + program_names(info))
        .with_file(archive.path);
  return info.models[0].name;
}

}  // namespace ckpt::pt2
