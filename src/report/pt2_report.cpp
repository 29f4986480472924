#include "report/pt2_report.h"

#include <map>
#include <set>

#include "base/text.h"
#include "ckpt/pt2.h"

namespace ckpt {
namespace {

nlohmann::json dims_json(const std::vector<pt2::dim>& dims) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& d : dims) {
    if (d.value) a.push_back(*d.value);
    else a.push_back(d.expr);
  }
  return a;
}

nlohmann::json value_json(const pt2::value& v) {
  nlohmann::json j = {{"kind", v.kind}};
  if (!v.name.empty()) j["name"] = v.name;
  if (v.has_meta) {
    j["dtype"] = v.dtype;
    j["shape"] = dims_json(v.shape);
    j["device"] = v.device;
  }
  if (!v.text.empty()) j["value"] = v.text;
  return j;
}

nlohmann::json spec_json(const pt2::signature_entry& e) {
  nlohmann::json j = value_json(e.arg);
  j["role"] = e.role;
  if (!e.target.empty()) j["target"] = e.target;
  if (e.persistent) j["persistent"] = *e.persistent;
  return j;
}

// The symbols the signature's dims use, each with the hint it was traced at.
void collect_symbols(const std::vector<pt2::dim>& dims, std::map<std::string, const pt2::dim*>& out) {
  for (const auto& d : dims)
    if (!d.value) out.emplace(d.expr, &d);
}

}  // namespace

std::string pt2::range::text() const {
  return symbol + " \u2208 [" + (min ? std::to_string(*min) : std::string("-\u221e")) + ", " +
         (max ? std::to_string(*max) : std::string("\u221e")) + "]";
}

nlohmann::json pt2_inspect_json(const checkpoint& c, bool graph) {
  const pt2::archive_info& a = *c.pt2;
  nlohmann::json j;
  j["archive_version"] = a.archive_version;
  j["root"] = a.root;
  j["aoti_models"] = a.aoti_models;
  j["other_records"] = a.other_records;
  j["extra_files"] = nlohmann::json::array();
  for (const auto& [n, size] : a.extra_files) j["extra_files"].push_back({{"name", n}, {"size", size}});
  j["models"] = nlohmann::json::array();
  for (const pt2::model& m : a.models) {
    const pt2::program& p = m.prog;
    nlohmann::json jm;
    jm["name"] = m.name;
    jm["key_prefix"] = m.key_prefix;
    jm["record"] = p.record;
    jm["schema_version"] = {{"major", p.schema_major ? nlohmann::json(*p.schema_major) : nlohmann::json(nullptr)},
                            {"minor", p.schema_minor ? nlohmann::json(*p.schema_minor) : nlohmann::json(nullptr)}};
    jm["opset_version"] = nlohmann::json::object();
    for (const auto& [ns, v] : p.opset_version) jm["opset_version"][ns] = v;
    jm["torch_version"] = p.torch_version;
    jm["verifiers"] = p.verifiers;
    jm["guards"] = p.guards;
    jm["weights"] = m.weights;
    jm["constants"] = m.constants;
    jm["sample_inputs"] = m.sample_inputs;
    jm["opaque"] = nlohmann::json::array();
    for (const auto& o : m.opaque)
      jm["opaque"].push_back({{"fqn", o.fqn}, {"file", o.file}, {"what", o.what}, {"nbytes", o.nbytes},
                              {"config", o.weight ? "weights" : "constants"}});
    jm["inputs"] = nlohmann::json::array();
    for (const auto& e : p.inputs) jm["inputs"].push_back(spec_json(e));
    jm["outputs"] = nlohmann::json::array();
    for (const auto& e : p.outputs) jm["outputs"].push_back(spec_json(e));
    std::map<std::string, const pt2::dim*> symbols;
    for (const auto& e : p.inputs)
      if (e.role == "user_input") collect_symbols(e.arg.shape, symbols);
    jm["ranges"] = nlohmann::json::array();
    for (const auto& r : p.ranges) {
      nlohmann::json jr = {{"symbol", r.symbol}, {"text", r.text()}};
      jr["min"] = r.min ? nlohmann::json(*r.min) : nlohmann::json(nullptr);
      jr["max"] = r.max ? nlohmann::json(*r.max) : nlohmann::json(nullptr);
      auto s = symbols.find(r.symbol);
      if (s != symbols.end() && s->second->hint) jr["hint"] = *s->second->hint;
      jm["ranges"].push_back(std::move(jr));
    }
    jm["call"] = {{"forward_arg_names", p.forward_arg_names},
                  {"in_spec", p.in_spec},
                  {"out_spec", p.out_spec},
                  {"signature", p.call}};
    jm["submodules"] = p.submodules;
    // null, not 0, for a program opened without its graph (open_options::read_pt2_graph).
    jm["nodes"] = p.graph_read ? nlohmann::json(p.nodes.size()) : nlohmann::json(nullptr);
    if (graph) {
      nlohmann::json nodes = nlohmann::json::array();
      for (const auto& n : p.nodes) {
        nlohmann::json jn = {{"name", n.name}, {"target", n.target}, {"module", n.module}, {"module_type", n.module_type}};
        jn["outputs"] = nlohmann::json::array();
        for (const auto& o : n.outputs) jn["outputs"].push_back(value_json(o));
        nodes.push_back(std::move(jn));
      }
      jm["graph"] = std::move(nodes);
    }
    j["models"].push_back(std::move(jm));
  }
  return j;
}

pt2_check check_pt2(const checkpoint& c) {
  pt2_check out;
  if (!c.pt2) return out;
  for (const pt2::model& m : c.pt2->models) {
    const std::string in_model = c.pt2->models.size() > 1 ? " of model '" + m.name + "'" : std::string();
    // The configs' entries of this model: FQN -> tensor record (nullptr: opaque).
    std::map<std::string, const tensor_record*> weights, constants;
    for (const tensor_record& t : c.tensors) {
      size_t at = 0;
      if (m.key_prefix.size()) {
        if (t.path.empty() || t.path[0] != path_element(m.name)) continue;
        at = 1;
      }
      const bool constant = t.path.size() > at + 1;
      const std::string& fqn = std::get<std::string>(t.path.back());
      (constant ? constants : weights)[fqn] = &t;
    }
    for (const auto& o : m.opaque) (o.weight ? weights : constants)[o.fqn] = nullptr;

    std::set<std::string> named_weights, named_constants;
    for (const pt2::signature_entry& e : m.prog.inputs) {
      const bool in_weights = e.role == "parameter" || (e.role == "buffer" && e.persistent.value_or(true));
      if (!in_weights && e.role != "buffer" && e.role != "tensor_constant" && e.role != "custom_obj") continue;
      auto& config = in_weights ? weights : constants;
      const char* config_name = in_weights ? "weights config" : "constants config";
      (in_weights ? named_weights : named_constants).insert(e.target);
      const std::string what = e.role + " " + text::quote(e.target, 120) + in_model;
      auto it = config.find(e.target);
      if (it == config.end()) {
        out.problems.push_back(what + " is not in the " + config_name + " (torch.export.load cannot give it a value)");
        continue;
      }
      const tensor_record* t = it->second;
      if (!t || !e.arg.has_meta) continue;
      if (e.role == "parameter" && !t->parameter)
        out.problems.push_back(what + ": the weights config says is_param false");
      if (e.role == "buffer" && t->parameter) out.problems.push_back(what + ": the weights config says is_param true");
      if (e.arg.dtype != name(t->type))
        out.problems.push_back(what + ": the program says " + e.arg.dtype + ", the " + config_name + " " + name(t->type));
      bool same = e.arg.shape.size() == t->shape.size();
      for (size_t i = 0; same && i < t->shape.size(); ++i) same = e.arg.shape[i].value == t->shape[i];
      if (!same) {
        std::string shape;
        for (size_t i = 0; i < e.arg.shape.size(); ++i) shape += (i ? ", " : "") + e.arg.shape[i].text();
        out.problems.push_back(what + ": the program says shape [" + shape + "], the " + config_name + " " +
                               text::shape(std::vector<int64_t>(t->shape.begin(), t->shape.end())));
      }
    }
    for (const auto& [fqn, t] : weights)
      if (!named_weights.count(fqn))
        out.notes.push_back("weights config entry " + text::quote(fqn, 120) + in_model +
                            " is no parameter or persistent buffer of the program");
    for (const auto& [fqn, t] : constants)
      if (!named_constants.count(fqn))
        out.notes.push_back("constants config entry " + text::quote(fqn, 120) + in_model +
                            " is no constant or non-persistent buffer of the program");
    if (!m.sample_inputs)
      out.problems.push_back("no data/sample_inputs/" + m.name + ".pt" + " (torch.export.load reads it)");
    if (!m.opaque.empty())
      out.notes.push_back(std::to_string(m.opaque.size()) + " pickled entr" + (m.opaque.size() == 1 ? "y" : "ies") +
                          in_model + " listed, not read (ckptool runs no unpickler): their CRC alone was checked");
  }
  for (const auto& a : c.pt2->aoti_models)
    out.notes.push_back("AOTInductor model '" + a + "' (data/aotinductor/" + a + "/): not checked here");
  return out;
}

}  // namespace ckpt
