#include "rekey/rekey_pt2.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "base/text.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "ckpt/zip_writer.h"
#include "formats/pt2_program.h"
#include "formats/pt2_schema.h"

namespace ckpt::detail {
namespace {

using pt2s::json;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string module_of(const std::string& k) {
  const size_t dot = k.rfind('.');
  return dot == std::string::npos ? std::string() : k.substr(0, dot);
}
bool within(const std::string& path, const std::string& ancestor) {
  if (ancestor.empty()) return true;
  return path == ancestor ||
         (path.size() > ancestor.size() && path.compare(0, ancestor.size(), ancestor) == 0 && path[ancestor.size()] == '.');
}
size_t segments(const std::string& p) { return p.empty() ? 0 : size_t(std::count(p.begin(), p.end(), '.')) + 1; }
std::string first_segments(const std::string& p, size_t n) {
  size_t pos = 0;
  for (size_t i = 0; i < n; ++i) {
    pos = p.find('.', pos);
    if (pos == std::string::npos) return p;
    if (i + 1 < n) ++pos;
  }
  return p.substr(0, pos);
}

[[noreturn]] void refuse(const std::string& what) { throw error(errc::unsupported, what); }

// nlohmann reads an integer beyond 64 bits as a double, so writing the record back would
// change it; Python's json writes any int. Such a record is refused, never rounded.
void check_integers_fit(std::string_view text, const std::string& record) {
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') ++i;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') {
      in_string = true;
      continue;
    }
    if ((ch >= '0' && ch <= '9') || ch == '-') {
      size_t j = i + (ch == '-');
      size_t digits = 0;
      while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j, ++digits;
      const bool fraction = j < text.size() && (text[j] == '.' || text[j] == 'e' || text[j] == 'E');
      if (!fraction && digits > 18)
        refuse("record " + record + " holds the integer " + std::string(text.substr(i, std::min<size_t>(j - i, 40))) +
               ", which this build cannot write back exactly");
      while (j < text.size() && ((text[j] >= '0' && text[j] <= '9') || text[j] == '.' || text[j] == 'e' ||
                                 text[j] == 'E' || text[j] == '+' || text[j] == '-'))
        ++j;
      i = j - 1;
    }
  }
}

std::vector<uint8_t> to_bytes(const json& j) {
  // Python's json.loads reads any valid JSON; the separators it wrote are not significant.
  const std::string s = j.dump(-1, ' ', false, json::error_handler_t::strict);
  return {s.begin(), s.end()};
}

// One model of the archive: its names, old -> new, and how its module paths move.
struct model_plan {
  std::string name, prefix;  // prefix: "" for an archive of one model, else "<name>/"
  const zip::entry* program = nullptr;
  const zip::entry* weights_cfg = nullptr;
  const zip::entry* constants_cfg = nullptr;
  std::vector<std::string> weights, constants;      // FQNs in config order
  std::unordered_map<std::string, std::string> to;  // every FQN of both configs -> new
  module_rules rules;
  std::map<std::string, std::string> module_cache;  // module path -> new path
};

class pt2_rekeyer {
 public:
  pt2_rekeyer(checkpoint& c, const rekey_request& req, rekey_result& result)
      : c_(c), req_(req), result_(result), ar_(*c.single_file("rekey").zip) {}

  void run() {
    check_records();
    read_names();
    plan();
    check_plan();
    for (model_plan& m : models_) {
      rewrite_config(m, m.weights_cfg);
      rewrite_config(m, m.constants_cfg);
      rewrite_program(m);
    }
    if (req_.dry_run) return;
    if (!req_.output || req_.output->fd() < 0) throw error(errc::usage, "rekey: no open output given");
    write();
    if (!req_.output->is_stream()) read_back();
  }

 private:
  // Records that name nothing (tensor files, sample inputs, extra files, the small records)
  // are copied; a record that might name a key and that this build does not rewrite makes
  // the archive unsupported, rather than half renamed.
  void check_records() {
    const pt2::archive_info& info = *c_.pt2;
    if (!info.aoti_models.empty())
      refuse("the archive holds AOTInductor model(s) (data/aotinductor/" + info.aoti_models.front() +
             "/), whose compiled code names the weights; rekey renames ExportedProgram archives only");
    if (!info.other_records.empty())
      refuse("record " + text::quote(info.other_records.front(), 120) +
             " is not one this build knows, and it may name the keys; nothing written");
  }

  std::string read_text(const zip::entry& e) {
    if (e.uncompressed_size > req_.reader.max_json_bytes)
      throw_limit("record " + std::string(e.name) + " is over the JSON record limit", e.data_offset);
    const auto bytes = ar_.read_record(e);
    return {bytes.begin(), bytes.end()};
  }

  void read_names() {
    std::set<std::string> named_files;
    for (const pt2::model& pm : c_.pt2->models) {
      model_plan m;
      m.name = pm.name;
      m.prefix = pm.key_prefix;
      m.program = ar_.find(pm.prog.record);
      m.weights_cfg = ar_.find("data/weights/" + pm.name + "_weights_config.json");
      m.constants_cfg = ar_.find("data/constants/" + pm.name + "_constants_config.json");
      if (!m.program || !m.weights_cfg || !m.constants_cfg) refuse("model '" + pm.name + "' lacks a record it had");
      for (const auto& p : parse_payload_config(read_text(*m.weights_cfg), {std::string(m.weights_cfg->record), m.weights_cfg->data_offset})) {
        m.weights.push_back(p.fqn);
        named_files.insert("data/weights/" + p.path_name);
      }
      for (const auto& p : parse_payload_config(read_text(*m.constants_cfg), {std::string(m.constants_cfg->record), m.constants_cfg->data_offset})) {
        m.constants.push_back(p.fqn);
        named_files.insert("data/constants/" + p.path_name);
      }
      named_files.insert(std::string(m.weights_cfg->record));
      named_files.insert(std::string(m.constants_cfg->record));
      models_.push_back(std::move(m));
    }
    // Under data/weights/ and data/constants/ only the configs and the files they name:
    // another record there (a reserved *_model_param_config.json) may name keys.
    for (const auto& e : ar_.entries()) {
      const std::string r(e.record);
      if ((starts_with(r, "data/weights/") || starts_with(r, "data/constants/")) && !named_files.count(r))
        refuse("record " + text::quote(r, 120) + " is neither a payload config nor a file one names; it may name the "
               "keys, and this build does not rewrite it; nothing written");
    }
  }

  void plan() {
    bool map_op = false;
    for (const auto& op : req_.ops) map_op |= op.kind == key_op::map;
    // A --map or --match names keys as the checkpoint does ("encoder/0.weight"), which are
    // not the names the programs use.
    if (map_op && models_.size() > 1)
      throw error(errc::unsupported, "--map and --match rename the keys of an archive of one model; this one holds " +
                                         std::to_string(models_.size()) + " (use --rename, --strip-*, --add-*)");
    std::set<std::string> used;
    auto note_used = [&](const rekey_plan& p) {
      std::set<std::string> unused(p.unused_ops.begin(), p.unused_ops.end());
      for (const auto& op : req_.ops)
        if (!unused.count(op.describe())) used.insert(op.describe());
    };
    for (model_plan& m : models_) {
      const rekey_plan w = plan_rekey(m.weights, req_.ops);
      note_used(w);
      std::vector<std::pair<std::string, std::string>> all = w.mapping;
      if (map_op) {
        // A map lists state-dict keys; a constant follows its module, as _metadata does.
        const module_rules r = derive_module_rules(w.mapping);
        for (const auto& k : m.constants) {
          const size_t dot = k.rfind('.');
          const std::string leaf = dot == std::string::npos ? k : k.substr(dot + 1);
          all.emplace_back(k, text::join_dotted(map_module_path(r, module_of(k)), leaf));
        }
      } else {
        const rekey_plan cp = plan_rekey(m.constants, req_.ops);
        note_used(cp);
        all.insert(all.end(), cp.mapping.begin(), cp.mapping.end());
      }
      // Parameters, buffers and constants are attributes of one module tree: no two may
      // share a name, whichever config holds them.
      std::map<std::string, std::vector<std::string>> claims;
      for (const auto& [from, to] : all) {
        if (to.empty() && !from.empty()) result_.plan.emptied.push_back(m.prefix + from);
        claims[to].push_back(from);
        m.to[from] = to;
      }
      for (auto& [to, from] : claims)
        if (from.size() > 1) {
          std::vector<std::string> named;
          for (const auto& f : from) named.push_back(m.prefix + f);
          result_.plan.collisions.emplace_back(m.prefix + to, named);
        }
      for (const auto& [from, to] : w.mapping) {
        result_.plan.mapping.emplace_back(m.prefix + from, m.prefix + to);
        if (from != to) ++result_.plan.changed;
      }
      for (size_t i = w.mapping.size(); i < all.size(); ++i)
        if (all[i].first != all[i].second) ++result_.constants_renamed;
      m.rules = derive_module_rules(all);
    }
    for (const auto& op : req_.ops)
      if (!used.count(op.describe())) result_.plan.unused_ops.push_back(op.describe());
  }

  static std::string listed(const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
    if (names.size() > 5) out += ", ... (" + std::to_string(names.size() - 5) + " more)";
    return out;
  }

  void check_plan() {
    const rekey_plan& p = result_.plan;
    if (!p.emptied.empty())
      throw error(errc::check_failed, std::to_string(p.emptied.size()) +
                                          " name(s) would be renamed to the empty string; nothing written: " + listed(p.emptied));
    if (!p.collisions.empty()) {
      std::vector<std::string> lines;
      for (const auto& [to, from] : p.collisions) lines.push_back("'" + to + "' <- " + listed(from));
      throw error(errc::check_failed, std::to_string(p.collisions.size()) +
                                          " new name(s) would be claimed by several parameters, buffers or constants; "
                                          "nothing written: " + listed(lines));
    }
  }

  // The new name of a signature target: every target is a name of one of the configs.
  std::string target(model_plan& m, const std::string& fqn, const std::string& field) {
    auto it = m.to.find(fqn);
    if (it == m.to.end())
      refuse(std::string(m.program->record) + ": the signature's " + field + " " + text::quote(fqn, 120) +
             " is in neither payload config, so it cannot be renamed with them");
    if (it->second != fqn) ++result_.program_references;
    return it->second;
  }

  // Where module path `path` goes: where the module rules take it, provided every name
  // below it lands in the module the rules give its own module (a leaf may change); a
  // module whose names go separate ways is refused.
  std::string module_path(model_plan& m, const std::string& path, const std::string& record) {
    if (path.empty()) return path;
    auto cached = m.module_cache.find(path);
    if (cached != m.module_cache.end()) return cached->second;
    // module_call_graph names a module's later calls "fc@1".
    std::string base = path, call;
    const size_t at = path.rfind('@');
    if (at != std::string::npos && at + 1 < path.size() &&
        path.find_first_not_of("0123456789", at + 1) == std::string::npos) {
      base = path.substr(0, at);
      call = path.substr(at);
    }
    const std::string moved = map_module_path(m.rules, base);
    for (const auto& [from, to] : m.to) {
      if (!within(from, base) || from == base) continue;
      const std::string want = map_module_path(m.rules, module_of(from));
      if (module_of(to) != want)
        refuse(record + ": module " + text::quote(base, 120) + " would become " + text::quote(moved, 120) + " but " +
               text::quote(from, 120) + " becomes " + text::quote(to, 120) +
               ": its names do not move together, so the program's module paths cannot be renamed exactly");
    }
    std::string out = moved.empty() ? moved : moved + call;
    if (out != path) ++result_.program_references;
    m.module_cache[path] = out;
    return out;
  }

  void rewrite_config(model_plan& m, const zip::entry* e) {
    const std::string text = read_text(*e);
    const std::string record(e->record);
    check_integers_fit(text, record);
    json doc = pt2s::parse(text, {record, e->data_offset});
    json& config = doc.at("config");
    json renamed = json::object();
    for (auto& [k, v] : config.items()) renamed[m.to.at(k)] = std::move(v);
    config = std::move(renamed);
    rewritten_[record] = to_bytes(doc);
  }

  std::string rewrite_stack(model_plan& m, const std::string& stack, const std::string& record) {
    // "key,path,class" entries joined by ';', the fields split at commas outside brackets
    // (serialize.py's metadata_split).
    std::string out;
    size_t start = 0;
    bool first = true;
    std::string last;
    while (start <= stack.size()) {
      size_t end = stack.find(';', start);
      if (end == std::string::npos) end = stack.size();
      const std::string item = stack.substr(start, end - start);
      std::vector<std::string> parts;
      int depth = 0;
      size_t from = 0;
      for (size_t i = 0; i < item.size(); ++i) {
        const char ch = item[i];
        if (ch == '[' || ch == '(') ++depth;
        else if (ch == ']' || ch == ')') --depth;
        else if (ch == ',' && depth == 0) {
          parts.push_back(item.substr(from, i - from));
          from = i + 1;
        }
      }
      parts.push_back(item.substr(from));
      if (parts.size() != 3)
        refuse(record + ": an nn_module_stack entry " + text::quote(item, 120) + " is not key,path,class");
      const std::string moved = module_path(m, parts[1], record);
      // A wrapper that collapses into its parent (the `_orig_mod` of torch.compile) is no
      // module of its own any more.
      if (first || moved == parts[1] || moved != last) {
        if (!first) out += ';';
        out += parts[0] + "," + moved + "," + parts[2];
        first = false;
        last = moved;
      }
      start = end + 1;
    }
    return out;
  }

  void rewrite_stacks(model_plan& m, json& j, const std::string& record) {
    if (j.is_object()) {
      for (auto& [k, v] : j.items()) {
        if (k == "nn_module_stack" && v.is_string())
          v = rewrite_stack(m, v.get<std::string>(), record);
        else
          rewrite_stacks(m, v, record);
      }
    } else if (j.is_array()) {
      for (auto& v : j) rewrite_stacks(m, v, record);
    }
  }

  void rewrite_program(model_plan& m) {
    const std::string text = read_text(*m.program);
    const std::string record(m.program->record);
    check_integers_fit(text, record);
    json doc = pt2s::parse(text, {record, m.program->data_offset});
    json& gm = doc.at("graph_module");
    static const char* const kTargets[] = {"parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name"};
    json& sig = gm.at("signature");
    for (const char* side : {"input_specs", "output_specs"})
      for (json& spec : sig.at(side))
        for (auto& [tag, body] : spec.items())
          if (body.is_object())
            for (const char* field : kTargets)
              if (body.contains(field) && body[field].is_string())
                body[field] = target(m, body[field].get<std::string>(), field);

    // module_call_graph: every entry's path moved; an entry that collapses into the root is
    // dropped (an uncompiled export has none), and wrappers an edit adds are listed, as the
    // export of the wrapped model would list them.
    json& calls = gm.at("module_call_graph");
    json out = json::array();
    std::set<std::string> present{""};
    for (json& entry : calls) {
      const std::string fqn = entry.at("fqn").get<std::string>();
      const std::string moved = module_path(m, fqn, record);
      // A wrapper that collapses into its parent (or the root) is no module of its own any more.
      if (!fqn.empty() && moved != fqn && (moved.empty() || present.count(moved))) {
        if (entry.contains("signature") && !entry["signature"].is_null())
          refuse(record + ": module " + text::quote(fqn, 120) + " has a preserved call signature and would merge into " +
                 (moved.empty() ? std::string("the root") : text::quote(moved, 120)) + "; nothing written");
        ++result_.program_references;
        continue;
      }
      entry["fqn"] = moved;
      present.insert(moved);
      out.push_back(std::move(entry));
    }
    std::vector<std::string> added;
    for (const auto& [from, to] : m.rules.rules) {
      // The common leading part stays; each level between it and `to` is a new module, and
      // so is `from` itself when `to` wraps it (its old root, for from == "").
      size_t common = 0;
      while (common < segments(from) && common < segments(to) && first_segments(from, common + 1) == first_segments(to, common + 1))
        ++common;
      for (size_t n = common + 1; n < segments(to); ++n) added.push_back(first_segments(to, n));
      if (common == segments(from) && !to.empty() && to != from) {
        if (!from.empty()) added.push_back(from);
        if (from.empty()) added.push_back(to);
      }
    }
    std::sort(added.begin(), added.end(), [](const std::string& a, const std::string& b) { return segments(a) < segments(b); });
    for (const std::string& path : added) {
      if (path.empty() || present.count(path)) continue;
      size_t pos = out.size();
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i]["fqn"].get<std::string>() != "" && within(out[i]["fqn"].get<std::string>(), path)) {
          pos = i;
          break;
        }
      json entry = json::object();
      entry["fqn"] = path;
      entry["signature"] = nullptr;
      out.insert(out.begin() + std::ptrdiff_t(pos), std::move(entry));
      present.insert(path);
      ++result_.program_references;
    }
    calls = std::move(out);
    rewrite_stacks(m, gm, record);
    check_no_old_names(m, doc, record);
    rewritten_[record] = to_bytes(doc);
  }

  // A last look: no string of the rewritten program may still be a name that moved (unless
  // it is also a new name). One would be a place this build does not know to rewrite.
  void check_no_old_names(const model_plan& m, const json& doc, const std::string& record) {
    std::unordered_set<std::string> new_names;
    for (const auto& [from, to] : m.to) new_names.insert(to);
    for (const auto& [from, to] : m.module_cache) new_names.insert(to);
    std::unordered_set<std::string> moved;
    for (const auto& [from, to] : m.to)
      if (from != to && !new_names.count(from)) moved.insert(from);
    for (const auto& [from, to] : m.module_cache)
      if (from != to && !new_names.count(from)) moved.insert(from);
    std::vector<const json*> stack{&doc};
    while (!stack.empty()) {
      const json* j = stack.back();
      stack.pop_back();
      if (j->is_string()) {
        if (moved.count(j->get_ref<const std::string&>()))
          refuse(record + ": " + text::quote(j->get<std::string>(), 120) +
                 " is still named in a place this build does not rewrite; nothing written");
      } else if (j->is_structured()) {
        for (const auto& v : *j) stack.push_back(&v);
      }
    }
  }

  void write() {
    output_file& out = *req_.output;
    const source_file& f = c_.single_file("rekey");
    zip::writer w(out.fd(), ar_.prefix(), 64);
    w.on_bytes_out([&](uint64_t bytes_out) {
      out.start_writeback(bytes_out);
      if (req_.progress) req_.progress(bytes_out, f.size);
    });
    auto* fs = dynamic_cast<const file_source*>(f.source.get());
    // Records in their order (torch.export.save writes archive_format last); the tensor
    // files, sample inputs and extra files byte for byte with their CRCs.
    for (const zip::entry& e : ar_.entries()) {
      auto it = rewritten_.find(std::string(e.record));
      if (it != rewritten_.end()) {
        w.add_record(e.record, it->second);
      } else if (e.method == 0 && fs) {
        w.add_record_copy(e.record, fs->fd(), e.data_offset, e.compressed_size, e.crc32);
      } else {
        w.add_record(e.record, ar_.read_record(e));
      }
    }
    w.finish();
    result_.bytes_written = w.offset();
  }

  // The archive written must read back as planned before it replaces anything: the same
  // tensors with the new names, the same files (sizes and CRCs), the signature's new targets.
  void read_back() {
    checkpoint out = open_checkpoint(req_.output->temp_path(), req_.reader);
    auto fail = [](const std::string& what) {
      throw error(errc::io, "the written archive does not read back " + what + " (internal error; nothing replaced)");
    };
    if (out.format != file_format::pt2 || !out.pt2 || out.pt2->models.size() != models_.size()) fail("as the same archive");
    // Opaque entries (pickled subclasses, script objects) are in the plan but are no keys.
    std::unordered_map<std::string, std::string> renamed(result_.plan.mapping.begin(), result_.plan.mapping.end());
    if (out.keys.size() != c_.keys.size()) fail("with the new keys");
    for (size_t k = 0; k < out.keys.size(); ++k) {
      auto it = renamed.find(std::string(c_.keys.key(k)));
      if (it == renamed.end() || out.keys.key(k) != it->second) fail("with the new keys");
    }
    if (out.tensors.size() != c_.tensors.size() || out.storages.size() != c_.storages.size()) fail("with the same tensors");
    for (size_t i = 0; i < out.storages.size(); ++i)
      if (out.storages[i].nbytes != c_.storages[i].nbytes || out.storages[i].crc32 != c_.storages[i].crc32)
        fail("with the same tensor files");
    for (size_t i = 0; i < out.tensors.size(); ++i) {
      const tensor_record &a = c_.tensors[i], &b = out.tensors[i];
      if (a.type != b.type || a.shape != b.shape || a.stride != b.stride || a.storage_offset != b.storage_offset ||
          a.storage != b.storage || a.path.size() != b.path.size())
        fail("with the same tensors");
    }
    for (size_t i = 0; i < models_.size(); ++i) {
      const auto& before = c_.pt2->models[i].prog;
      const auto& after = out.pt2->models[i].prog;
      if (before.inputs.size() != after.inputs.size() || before.outputs.size() != after.outputs.size())
        fail("with the same signature");
      auto same = [&](const std::vector<pt2::signature_entry>& x, const std::vector<pt2::signature_entry>& y) {
        for (size_t s = 0; s < x.size(); ++s) {
          // user_input_name targets name graph values, which keep their names.
          auto it = models_[i].to.find(x[s].target);
          const std::string want = it == models_[i].to.end() ? x[s].target : it->second;
          if (x[s].role != y[s].role || y[s].target != want) fail("with the signature renamed");
        }
      };
      same(before.inputs, after.inputs);
      same(before.outputs, after.outputs);
    }
  }

  checkpoint& c_;
  const rekey_request& req_;
  rekey_result& result_;
  const zip::archive& ar_;
  std::vector<model_plan> models_;
  std::map<std::string, std::vector<uint8_t>> rewritten_;  // record -> new bytes
};

}  // namespace

void rekey_pt2(checkpoint& c, const rekey_request& req, rekey_result& result) {
  if (!c.pt2) throw error(errc::unsupported, "not a torch.export archive").with_file(c.path);
  try {
    pt2_rekeyer(c, req, result).run();
  } catch (const nlohmann::json::exception& e) {
    // The reader checked the records this rewrites; a shape it did not check (a member of
    // another type) is refused here rather than escape as an internal error.
    throw error(errc::corrupt, std::string("a program or config record is not as the schema says: ") +
                                   text::quote(e.what(), 160))
        .with_file(c.path);
  }
}

}  // namespace ckpt::detail
