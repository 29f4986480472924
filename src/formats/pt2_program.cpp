#include "formats/pt2_program.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <unordered_map>

#include "base/text.h"

namespace ckpt::detail {
namespace {

using pt2s::json;
using pt2s::member;
using pt2s::optional_member;
using pt2s::to_array;
using pt2s::to_bool;
using pt2s::to_int;
using pt2s::to_object;
using pt2s::to_string;
using pt2s::union_of;
using pt2s::where;

// A file name inside data/weights or data/constants: the loader joins it to the folder.
bool plain_file_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || s == "." || s == "..") return false;
  return std::none_of(s.begin(), s.end(), [](char c) { return c == '/' || c == '\\' || c == '\0'; });
}

std::string q(const std::string& s) { return text::quote(s, 120); }

}  // namespace

std::vector<payload_entry> parse_payload_config(std::string_view text, const where& w) {
  const json doc = pt2s::parse(text, w);
  const json& config = to_object(member(doc, "config", w, "the payload config"), w, "'config'");
  std::vector<payload_entry> out;
  out.reserve(config.size());
  for (auto it = config.begin(); it != config.end(); ++it) {
    const std::string what = "entry " + q(it.key());
    const json& e = to_object(it.value(), w, what);
    payload_entry p;
    p.fqn = it.key();
    if (p.fqn.empty()) w.fail(errc::corrupt, "an entry with an empty name");
    p.path_name = to_string(member(e, "path_name", w, what), w, what + " path_name");
    if (!plain_file_name(p.path_name))
      w.fail(errc::corrupt, what + ": path_name " + q(p.path_name) + " is not a plain file name");
    p.is_param = to_bool(member(e, "is_param", w, what), w, what + " is_param");
    p.use_pickle = to_bool(member(e, "use_pickle", w, what), w, what + " use_pickle");
    if (const json* m = optional_member(e, "tensor_meta")) p.meta = pt2s::parse_tensor_meta(*m, w, what);
    out.push_back(std::move(p));
  }
  return out;
}

namespace {

// The graph's named values, for the signature's and the nodes' arguments.
class program_reader {
 public:
  program_reader(const json& graph, const where& w) : graph_(graph), w_(w) {
    if (const json* tv = optional_member(graph, "tensor_values"))
      for (auto it = to_object(*tv, w, "tensor_values").begin(); it != tv->end(); ++it)
        tensors_.emplace(it.key(), &it.value());
    if (const json* sv = optional_member(graph, "sym_int_values"))
      for (auto it = to_object(*sv, w, "sym_int_values").begin(); it != sv->end(); ++it)
        sym_ints_.emplace(it.key(), &it.value());
  }

  // A TensorArgument {"name": ...} with its metadata.
  pt2::value tensor(const json& arg, const std::string& what) {
    pt2::value v;
    v.kind = "tensor";
    v.name = to_string(member(arg, "name", w_, what), w_, what + " name");
    auto it = tensors_.find(v.name);
    if (it != tensors_.end()) {
      pt2s::tensor_meta m = pt2s::parse_tensor_meta(*it->second, w_, "tensor_values " + q(v.name));
      v.has_meta = true;
      v.dtype = name(m.type);
      v.shape = std::move(m.sizes);
      v.device = m.device;
    }
    return v;
  }

  // An Argument union; a list of tensors is several values (node outputs).
  void argument(const json& arg, const std::string& what, std::vector<pt2::value>& out) {
    auto [tag, body] = union_of(arg, w_, what);
    const json& b = *body;
    pt2::value v;
    v.kind = tag.compare(0, 3, "as_") == 0 ? tag.substr(3) : tag;
    if (tag == "as_tensor") {
      out.push_back(tensor(b, what));
      return;
    }
    if (tag == "as_tensors") {
      for (const auto& t : to_array(b, w_, what)) out.push_back(tensor(t, what));
      return;
    }
    if (tag == "as_optional_tensor" || tag == "as_optional_tensors") {
      auto one = [&](const json& o) {
        auto [otag, ob] = union_of(o, w_, what);
        if (otag == "as_tensor") {
          out.push_back(tensor(*ob, what));
        } else if (otag == "as_none") {
          pt2::value none;
          none.kind = "none";
          out.push_back(none);
        } else {
          w_.fail(errc::corrupt, what + ": unknown OptionalTensorArgument variant " + q(otag));
        }
      };
      if (tag == "as_optional_tensor") one(b);
      else for (const auto& o : to_array(b, w_, what)) one(o);
      return;
    }
    if (tag == "as_sym_int" || tag == "as_sym_float" || tag == "as_sym_bool") {
      auto [stag, sb] = union_of(b, w_, what);
      if (stag == "as_name") {
        v.name = to_string(*sb, w_, what);
        auto it = sym_ints_.find(v.name);
        if (tag == "as_sym_int" && it != sym_ints_.end()) v.text = pt2s::sym_int(*it->second, w_, "sym_int_values " + q(v.name)).text();
      } else if (stag == "as_int" || stag == "as_float" || stag == "as_bool") {
        v.text = sb->dump();
      } else {
        w_.fail(errc::corrupt, what + ": unknown " + tag.substr(3) + " variant " + q(stag));
      }
      out.push_back(v);
      return;
    }
    if (tag == "as_custom_obj") {
      v.name = to_string(member(b, "name", w_, what), w_, what + " name");
      v.text = to_string(member(b, "class_fqn", w_, what), w_, what + " class_fqn");
      out.push_back(v);
      return;
    }
    if (tag == "as_graph") {
      v.name = to_string(member(b, "name", w_, what), w_, what + " name");
      out.push_back(v);
      return;
    }
    static const std::set<std::string> kPlain = {
        "as_none", "as_int", "as_ints", "as_float", "as_floats", "as_string", "as_strings", "as_sym_ints",
        "as_scalar_type", "as_memory_format", "as_layout", "as_device", "as_bool", "as_bools", "as_sym_bools",
        "as_operator", "as_sym_floats", "as_complex", "as_nested_tensors", "as_int_lists", "as_string_to_argument"};
    if (!kPlain.count(tag)) w_.fail(errc::corrupt, what + ": unknown Argument variant " + q(tag));
    if (tag != "as_none") v.text = text::quote(b.dump(), 80);
    if (tag == "as_string") v.text = to_string(b, w_, what);
    out.push_back(v);
  }

  pt2::value one_argument(const json& arg, const std::string& what) {
    std::vector<pt2::value> vs;
    argument(arg, what, vs);
    if (vs.size() == 1) return vs[0];
    pt2::value v;
    auto [tag, body] = union_of(arg, w_, what);
    v.kind = tag.substr(3);
    v.text = std::to_string(vs.size()) + " values";
    return v;
  }

  pt2::value token(const json& arg, const std::string& what) {
    pt2::value v;
    v.kind = "token";
    v.name = to_string(member(arg, "name", w_, what), w_, what + " name");
    return v;
  }

  const json& graph_;
  const where& w_;
  std::unordered_map<std::string, const json*> tensors_, sym_ints_;
};

pt2::signature_entry input_spec(program_reader& r, const json& spec, const where& w, size_t i) {
  const std::string what = "input_specs[" + std::to_string(i) + "]";
  auto [tag, body] = union_of(spec, w, what);
  const json& b = *body;
  pt2::signature_entry e;
  e.role = tag;
  auto target = [&](const char* field) { e.target = to_string(member(b, field, w, what), w, what + " " + field); };
  if (tag == "user_input") {
    e.arg = r.one_argument(member(b, "arg", w, what), what + " arg");
  } else if (tag == "parameter") {
    e.arg = r.tensor(member(b, "arg", w, what), what + " arg");
    target("parameter_name");
  } else if (tag == "buffer") {
    e.arg = r.tensor(member(b, "arg", w, what), what + " arg");
    target("buffer_name");
    e.persistent = to_bool(member(b, "persistent", w, what), w, what + " persistent");
  } else if (tag == "tensor_constant") {
    e.arg = r.tensor(member(b, "arg", w, what), what + " arg");
    target("tensor_constant_name");
  } else if (tag == "custom_obj") {
    const json& a = member(b, "arg", w, what);
    e.arg.kind = "custom_obj";
    e.arg.name = to_string(member(a, "name", w, what), w, what + " arg name");
    e.arg.text = to_string(member(a, "class_fqn", w, what), w, what + " class_fqn");
    target("custom_obj_name");
  } else if (tag == "token") {
    e.arg = r.token(member(b, "arg", w, what), what + " arg");
  } else if (tag == "constant_input") {
    e.arg.name = to_string(member(b, "name", w, what), w, what + " name");
    auto [vtag, vb] = union_of(member(b, "value", w, what), w, what + " value");
    static const std::set<std::string> kConst = {"as_none", "as_int", "as_float", "as_string", "as_bool"};
    if (!kConst.count(vtag)) w.fail(errc::corrupt, what + ": unknown ConstantValue variant " + q(vtag));
    e.arg.kind = vtag.substr(3);
    e.arg.text = vtag == "as_string" ? to_string(*vb, w, what) : vtag == "as_none" ? "None" : vb->dump();
  } else {
    w.fail(errc::corrupt, what + ": unknown InputSpec variant " + q(tag));
  }
  return e;
}

pt2::signature_entry output_spec(program_reader& r, const json& spec, const where& w, size_t i) {
  const std::string what = "output_specs[" + std::to_string(i) + "]";
  auto [tag, body] = union_of(spec, w, what);
  const json& b = *body;
  pt2::signature_entry e;
  e.role = tag;
  static const std::unordered_map<std::string, const char*> kTargets = {
      {"loss_output", nullptr},
      {"buffer_mutation", "buffer_name"},
      {"gradient_to_parameter", "parameter_name"},
      {"gradient_to_user_input", "user_input_name"},
      {"user_input_mutation", "user_input_name"},
      {"parameter_mutation", "parameter_name"}};
  if (tag == "user_output") {
    e.arg = r.one_argument(member(b, "arg", w, what), what + " arg");
  } else if (tag == "token") {
    e.arg = r.token(member(b, "arg", w, what), what + " arg");
  } else if (auto it = kTargets.find(tag); it != kTargets.end()) {
    e.arg = r.tensor(member(b, "arg", w, what), what + " arg");
    if (it->second) e.target = to_string(member(b, it->second, w, what), w, what + " " + it->second);
  } else {
    w.fail(errc::corrupt, what + ": unknown OutputSpec variant " + q(tag));
  }
  return e;
}

// "L__self__,,__main__.M;L__self__fc,fc,torch.nn.modules.linear.Linear": the last entry's
// path and class. Paths hold no ',' or ';' (module names are identifiers and indices).
void owning_module(const std::string& stack, pt2::node& n) {
  if (stack.empty()) return;
  size_t start = stack.rfind(';');
  std::string last = stack.substr(start == std::string::npos ? 0 : start + 1);
  size_t a = last.find(',');
  if (a == std::string::npos) return;
  size_t b = last.find(',', a + 1);
  if (b == std::string::npos) return;
  n.module = last.substr(a + 1, b - a - 1);
  n.module_type = last.substr(b + 1);
}

}  // namespace

pt2::program parse_program(std::string_view text, const where& w, bool with_graph) {
  // Without the graph, the metadata of the values its nodes make goes too: the signature's
  // values are then shown without theirs.
  static const detail::left_out_members kGraph = {{"graph_module", "graph"}, {"nodes", "tensor_values"}};
  const json doc = with_graph ? pt2s::parse(text, w) : pt2s::parse(text, w, kGraph);
  pt2::program p;
  p.graph_read = with_graph;
  p.record = w.record;
  to_object(doc, w, "the program");
  const json& sv = member(doc, "schema_version", w, "the program");
  p.schema_major = to_int(member(sv, "major", w, "schema_version"), w, "schema_version major");
  p.schema_minor = to_int(member(sv, "minor", w, "schema_version"), w, "schema_version minor");
  if (const json* ov = optional_member(doc, "opset_version"))
    for (auto it = to_object(*ov, w, "opset_version").begin(); it != ov->end(); ++it)
      p.opset_version.emplace_back(it.key(), to_int(it.value(), w, "opset_version " + q(it.key())));
  if (const json* tv = optional_member(doc, "torch_version")) p.torch_version = to_string(*tv, w, "torch_version");
  if (const json* vs = optional_member(doc, "verifiers"))
    for (const auto& v : to_array(*vs, w, "verifiers")) p.verifiers.push_back(to_string(v, w, "a verifier"));
  if (const json* gs = optional_member(doc, "guards_code"))
    for (const auto& g : to_array(*gs, w, "guards_code")) p.guards.push_back(to_string(g, w, "guards_code"));
  if (const json* rc = optional_member(doc, "range_constraints"))
    for (auto it = to_object(*rc, w, "range_constraints").begin(); it != rc->end(); ++it) {
      const std::string what = "range_constraints " + q(it.key());
      pt2::range r;
      r.symbol = it.key();
      to_object(it.value(), w, what);
      if (const json* lo = optional_member(it.value(), "min_val")) r.min = to_int(*lo, w, what + " min_val");
      if (const json* hi = optional_member(it.value(), "max_val")) r.max = to_int(*hi, w, what + " max_val");
      p.ranges.push_back(std::move(r));
    }

  const json& gm = member(doc, "graph_module", w, "the program");
  const json& graph = member(gm, "graph", w, "graph_module");
  program_reader r(graph, w);
  const json& sig = member(gm, "signature", w, "graph_module");
  const json& ins = to_array(member(sig, "input_specs", w, "signature"), w, "input_specs");
  for (size_t i = 0; i < ins.size(); ++i) p.inputs.push_back(input_spec(r, ins[i], w, i));
  const json& outs = to_array(member(sig, "output_specs", w, "signature"), w, "output_specs");
  for (size_t i = 0; i < outs.size(); ++i) p.outputs.push_back(output_spec(r, outs[i], w, i));

  static const json kNoNodes = json::array();
  const json& nodes = with_graph ? to_array(member(graph, "nodes", w, "graph"), w, "nodes") : kNoNodes;
  p.nodes.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string what = "nodes[" + std::to_string(i) + "]";
    const json& n = to_object(nodes[i], w, what);
    pt2::node node;
    node.target = to_string(member(n, "target", w, what), w, what + " target");
    if (const json* nm = optional_member(n, "name")) node.name = to_string(*nm, w, what + " name");
    for (const auto& o : to_array(member(n, "outputs", w, what), w, what + " outputs"))
      r.argument(o, what + " output", node.outputs);
    // Inputs are not shown, but their tags are checked like every other union's.
    std::vector<pt2::value> ignored;
    for (const auto& in : to_array(member(n, "inputs", w, what), w, what + " inputs")) {
      r.argument(member(in, "arg", w, what + " input"), what + " input", ignored);
      ignored.clear();
    }
    if (const json* md = optional_member(n, "metadata"))
      if (const json* stack = optional_member(to_object(*md, w, what + " metadata"), "nn_module_stack"))
        owning_module(to_string(*stack, w, what + " nn_module_stack"), node);
    p.nodes.push_back(std::move(node));
  }

  const json& calls = to_array(member(gm, "module_call_graph", w, "graph_module"), w, "module_call_graph");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string what = "module_call_graph[" + std::to_string(i) + "]";
    const std::string& fqn = to_string(member(calls[i], "fqn", w, what), w, what + " fqn");
    if (!fqn.empty()) {
      p.submodules.push_back(fqn);
      continue;
    }
    const json* s = optional_member(calls[i], "signature");
    if (!s) continue;
    p.in_spec = to_string(member(*s, "in_spec", w, what), w, what + " in_spec");
    p.out_spec = to_string(member(*s, "out_spec", w, what), w, what + " out_spec");
    if (const json* names = optional_member(*s, "forward_arg_names"))
      for (const auto& n : to_array(*names, w, what + " forward_arg_names"))
        p.forward_arg_names.push_back(to_string(n, w, what + " forward_arg_names"));
  }
  if (!p.in_spec.empty() || !p.out_spec.empty()) {
    std::vector<std::string> in_names, out_names;
    for (const auto& e : p.inputs)
      if (e.role == "user_input") in_names.push_back(e.arg.name.empty() ? e.arg.text : e.arg.name);
    for (const auto& e : p.outputs)
      if (e.role == "user_output") out_names.push_back(e.arg.name.empty() ? e.arg.text : e.arg.name);
    auto in = render_treespec(p.in_spec, in_names), out = render_treespec(p.out_spec, out_names);
    if (in && out) p.call = *in + " -> " + *out;
  }
  return p;
}

std::optional<std::string> render_treespec(std::string_view spec, const std::vector<std::string>& leaves) {
  json doc;
  try {
    doc = json::parse(spec.begin(), spec.end(), [](int depth, json::parse_event_t, json&) {
      if (depth > 64) throw std::invalid_argument("too deep");
      return true;
    });
  } catch (const std::exception&) {
    return std::nullopt;
  }
  // [version 1, node]; node = {"type": name|null, "context": JSON text|null, "children_spec": [...]}.
  if (!doc.is_array() || doc.size() != 2 || doc[0] != 1) return std::nullopt;
  size_t next = 0;
  std::function<std::optional<std::string>(const json&, int)> render = [&](const json& n, int depth)
      -> std::optional<std::string> {
    if (depth > 64 || !n.is_object()) return std::nullopt;
    auto type = n.find("type"), children = n.find("children_spec"), context = n.find("context");
    if (type == n.end() || children == n.end() || !children->is_array()) return std::nullopt;
    if (type->is_null()) {
      if (!children->empty()) return std::nullopt;
      return next < leaves.size() ? leaves[next++] : (++next, std::string("*"));
    }
    if (!type->is_string()) return std::nullopt;
    std::vector<std::string> parts;
    for (const auto& c : *children) {
      auto s = render(c, depth + 1);
      if (!s) return std::nullopt;
      parts.push_back(*s);
    }
    auto join = [&](const std::string& open, const std::string& close) {
      std::string out = open;
      for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
      if (open == "(" && parts.size() == 1) out += ",";
      return out + close;
    };
    const std::string t = type->get<std::string>();
    if (t == "builtins.tuple") return join("(", ")");
    if (t == "builtins.list") return join("[", "]");
    if (t == "builtins.dict" || t == "collections.OrderedDict") {
      if (context == n.end() || !context->is_string()) return std::nullopt;
      json keys;
      try {
        keys = json::parse(context->get<std::string>());
      } catch (const std::exception&) {
        return std::nullopt;
      }
      if (!keys.is_array() || keys.size() != parts.size()) return std::nullopt;
      std::string out = "{";
      for (size_t i = 0; i < parts.size(); ++i)
        out += (i ? ", " : "") + (keys[i].is_string() ? "'" + keys[i].get<std::string>() + "'" : keys[i].dump()) +
               ": " + parts[i];
      return out + "}";
    }
    // A namedtuple or a registered class: its name and its children.
    std::string short_name = t.substr(t.rfind('.') == std::string::npos ? 0 : t.rfind('.') + 1);
    return join(short_name + "(", ")");
  };
  auto out = render(doc[1], 0);
  if (!out) return std::nullopt;
  return out;
}

}  // namespace ckpt::detail
