#include "torch/model_file_tensors.h"

#include <functional>
#include <map>
#include <optional>
#include <set>

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include "ckpt/error.h"
#include "ckpt/torchscript_code.h"
#include "model/row_major.h"
#include "torch/loader/storage_loader.h"

namespace ckpt::detail {
namespace {

// A place in the module that holds a tensor: where its value is in the model file, and how
// to put another tensor there.
struct site {
  std::string name;                 // for the report and for errors
  std::optional<value_path> path;   // of its record in the model file's pickles; none: unknown
  at::Tensor tensor;                // what is there now (meta after load_on_meta)
  std::function<void(const at::Tensor&)> set;
};

std::string key_text(const c10::IValue& key) {
  if (key.isString()) return "'" + key.toStringRef() + "'";
  if (key.isInt()) return std::to_string(key.toInt());
  return "?";
}

// Every tensor reachable from a module's object through attributes (of submodules and of
// script-class objects too), lists, dicts and tuples. Parameters and buffers are included
// only when asked: load_module fills those from the checkpoint.
class attribute_walker {
 public:
  explicit attribute_walker(bool with_parameters) : with_parameters_(with_parameters) {}

  void walk_module(const torch::jit::Module& m) {
    value_path path;
    walk(c10::IValue(m._ivalue()), path, true, "", nullptr);
  }

  std::vector<site> sites;

 private:
  using setter = std::function<void(const at::Tensor&)>;

  static std::string member(const std::string& base, const std::string& attr) {
    return base.empty() ? attr : base + "." + attr;
  }

  void walk(const c10::IValue& v, value_path& path, bool locatable, const std::string& name, setter set) {
    if (v.isTensor()) {
      if (v.toTensor().defined())
        sites.push_back({name, locatable ? std::optional<value_path>(path) : std::nullopt, v.toTensor(), std::move(set)});
      return;
    }
    if (!v.isObject() && !v.isList() && !v.isGenericDict() && !v.isTuple()) return;
    // One container reached twice (an alias, or a cycle through objects) is walked once.
    if (!visited_.insert(v.internalToPointer()).second) return;
    if (v.isObject()) {
      auto obj = v.toObject();
      const c10::ClassTypePtr& type = obj->type();
      for (size_t i = 0; i < type->numAttributes(); ++i) {
        if (!with_parameters_ && type->is_module() && (type->is_parameter(i) || type->is_buffer(i))) continue;
        const std::string attr = type->getAttributeName(i);
        path.emplace_back(attr);
        walk(obj->getSlot(i), path, locatable, member(name, attr), [obj, i](const at::Tensor& t) { obj->setSlot(i, t); });
        path.pop_back();
      }
    } else if (v.isList()) {
      c10::List<c10::IValue> list = v.toList();
      for (size_t i = 0; i < list.size(); ++i) {
        path.emplace_back(int64_t(i));
        walk(list.get(i), path, locatable, name + "[" + std::to_string(i) + "]",
             [list, i](const at::Tensor& t) mutable { list.set(i, t); });
        path.pop_back();
      }
    } else if (v.isGenericDict()) {
      c10::Dict<c10::IValue, c10::IValue> dict = v.toGenericDict();
      std::vector<std::pair<c10::IValue, c10::IValue>> items;
      for (const auto& kv : dict) items.emplace_back(kv.key(), kv.value());
      for (auto& item : items) {
        // Named, not a structured binding: C++17 lambdas cannot capture bindings (clang
        // refuses; GCC allows it as an extension).
        const c10::IValue& key = item.first;
        const c10::IValue& value = item.second;
        // The model file's pickle names a dict's values by string or integer key only.
        const bool keyed = key.isString() || key.isInt();
        if (key.isString())
          path.emplace_back(key.toStringRef());
        else
          path.emplace_back(key.isInt() ? key.toInt() : int64_t(0));
        walk(value, path, locatable && keyed, name + "[" + key_text(key) + "]",
             [dict, key](const at::Tensor& t) mutable { dict.insert_or_assign(key, t); });
        path.pop_back();
      }
    } else {
      auto tuple = v.toTuple();
      for (size_t i = 0; i < tuple->elements().size(); ++i) {
        path.emplace_back(int64_t(i));
        walk(tuple->elements()[i], path, locatable, name + "[" + std::to_string(i) + "]",
             [tuple, i](const at::Tensor& t) { tuple->unsafeSetElement(i, t); });
        path.pop_back();
      }
    }
  }

  bool with_parameters_;
  std::set<const void*> visited_;
};

// "CONSTANTS.c12" -> 12.
std::optional<int64_t> constant_index(const std::string& text) {
  static const std::string prefix = "CONSTANTS.c";
  if (text.size() <= prefix.size() || text.compare(0, prefix.size(), prefix) != 0 || text.size() > prefix.size() + 12)
    return std::nullopt;
  int64_t n = 0;
  for (size_t i = prefix.size(); i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    n = n * 10 + (text[i] - '0');
  }
  return n;
}

value_path constant_path(int64_t n) { return {std::string("<constants>"), n}; }

std::string constant_name(int64_t n) { return "CONSTANTS.c" + std::to_string(n); }

// Every function of the module's compilation unit (class methods, hooks, free functions),
// each once.
std::vector<torch::jit::GraphFunction*> graph_functions(const torch::jit::Module& m) {
  std::vector<torch::jit::GraphFunction*> out;
  std::set<torch::jit::Function*> seen;
  auto add = [&](torch::jit::Function* f) {
    if (!f || !seen.insert(f).second) return;
    if (auto* g = torch::jit::tryToGraphFunction(*f)) out.push_back(g);
  };
  for (torch::jit::Function* f : m._ivalue()->compilation_unit()->get_functions()) add(f);
  for (const auto& nm : m.named_modules()) {
    const auto& type = nm.value.type();
    for (torch::jit::Function* f : type->methods()) add(f);
    for (torch::jit::Function* f : type->getForwardHooks()) add(f);
    for (torch::jit::Function* f : type->getForwardPreHooks()) add(f);
  }
  return out;
}

// Tensor constants of a graph's nodes. The importer builds each use of CONSTANTS.cN as a
// constant node whose source range is that text of the code record (the model is loaded
// without its debug files), so the text says which entry of constants.pkl it holds.
void graph_constants(torch::jit::Block* block, const std::string& function, std::vector<site>& out) {
  for (torch::jit::Node* n : block->nodes()) {
    if (n->kind() == c10::prim::Constant && n->hasAttribute(c10::attr::value)) {
      if (n->kindOf(c10::attr::value) == torch::jit::AttributeKind::t) {
        at::Tensor t = n->t(c10::attr::value);
        std::optional<int64_t> index = constant_index(n->sourceRange().text().str());
        site s;
        s.name = index ? constant_name(*index) : "a tensor constant of " + function;
        if (index) s.path = constant_path(*index);
        s.tensor = t;
        s.set = [n](const at::Tensor& v) {
          n->t_(c10::attr::value, v);
          n->output()->inferTypeFrom(v);
        };
        out.push_back(std::move(s));
      } else if (n->kindOf(c10::attr::value) == torch::jit::AttributeKind::ival) {
        // A constant list or tuple holding tensors: not something the printer writes for
        // CONSTANTS.cN; reported if it is left on meta.
        const c10::IValue& v = n->ival(c10::attr::value);
        std::function<void(const c10::IValue&)> scan = [&](const c10::IValue& x) {
          if (x.isTensor() && x.toTensor().defined())
            out.push_back({"a constant holding tensors in " + function, std::nullopt, x.toTensor(), nullptr});
          else if (x.isList())
            for (const c10::IValue& e : x.toListRef()) scan(e);
          else if (x.isTuple())
            for (const c10::IValue& e : x.toTupleRef().elements()) scan(e);
        };
        scan(v);
      }
    }
    for (torch::jit::Block* sub : n->blocks()) graph_constants(sub, function, out);
  }
}

c10::Argument with_default(const c10::Argument& a, c10::IValue value) {
  return c10::Argument(a.name(), a.type(), a.real_type(), a.N(), std::move(value), a.kwarg_only(),
                       a.alias_info() ? std::optional<c10::AliasInfo>(*a.alias_info()) : std::nullopt);
}

// Schema defaults are replaced per function, all at once, after every site got its value.
struct schema_edit {
  torch::jit::GraphFunction* function;
  std::map<size_t, at::Tensor> defaults;  // argument index -> new default
};

struct constant_sites {
  std::vector<site> sites;
  std::vector<std::shared_ptr<schema_edit>> edits;
};

// Graph constants and tensor defaults of every function. `defaults` (from the code) says
// which constant each default is; without it a default is named by its function.
constant_sites find_constant_sites(const torch::jit::Module& m, const std::vector<constant_default>* defaults) {
  std::map<std::pair<std::string, std::string>, size_t> default_constant;
  if (defaults)
    for (const constant_default& d : *defaults) default_constant[{d.function, d.parameter}] = d.constant;
  constant_sites out;
  for (torch::jit::GraphFunction* f : graph_functions(m)) {
    const std::string fname = f->qualname().qualifiedName();
    graph_constants(f->graph()->block(), fname, out.sites);
    const c10::FunctionSchema& schema = f->getSchema();
    std::shared_ptr<schema_edit> edit;
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const c10::Argument& a = schema.arguments()[i];
      if (!a.default_value() || !a.default_value()->isTensor() || !a.default_value()->toTensor().defined()) continue;
      if (!edit) edit = std::make_shared<schema_edit>(schema_edit{f, {}});
      site s;
      auto it = default_constant.find({fname, a.name()});
      s.name = it != default_constant.end() ? constant_name(int64_t(it->second))
                                            : "the default of " + a.name() + " in " + fname;
      if (it != default_constant.end()) s.path = constant_path(int64_t(it->second));
      s.tensor = a.default_value()->toTensor();
      s.set = [edit, i](const at::Tensor& v) { edit->defaults[i] = v; };
      out.sites.push_back(std::move(s));
    }
    if (edit) out.edits.push_back(edit);
  }
  return out;
}

void apply(const schema_edit& e) {
  if (e.defaults.empty()) return;
  const c10::FunctionSchema& schema = e.function->getSchema();
  std::vector<c10::Argument> args;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    auto it = e.defaults.find(i);
    args.push_back(it == e.defaults.end() ? schema.arguments()[i] : with_default(schema.arguments()[i], it->second));
  }
  e.function->setSchema(schema.cloneWithArguments(std::move(args)));
}

// The model file's tensors by path. TorchScript's pickler wraps typed lists and dicts in
// calls (torch.jit._pickle.build_tensorlist([...]), restore_type_tag({...}, 'Dict[...]')),
// which our reader walks as ("__args__", 0); LibTorch's values have no such step.
class record_index {
 public:
  explicit record_index(const checkpoint& c) {
    for (size_t i = 0; i < c.tensors.size(); ++i) add(c.tensors[i].path, i);
    for (const tensor_alias& a : c.aliases) add(a.path, a.tensor);
  }

  // The record at `path`; nullopt when there is none, or more than one.
  std::optional<size_t> find(const value_path& path) const {
    auto it = by_path_.find(path);
    if (it == by_path_.end() || it->second == kAmbiguous) return std::nullopt;
    return it->second;
  }

 private:
  static constexpr size_t kAmbiguous = size_t(-1);

  void add(const value_path& raw, size_t record) {
    value_path p;
    for (size_t i = 0; i < raw.size(); ++i) {
      const auto* s = std::get_if<std::string>(&raw[i]);
      const auto* next = i + 1 < raw.size() ? std::get_if<int64_t>(&raw[i + 1]) : nullptr;
      if (s && *s == "__args__" && next && *next == 0) {
        ++i;
        continue;
      }
      p.push_back(raw[i]);
    }
    auto [it, fresh] = by_path_.emplace(std::move(p), record);
    if (!fresh && it->second != record) it->second = kAmbiguous;
  }

  std::map<value_path, size_t> by_path_;
};

value_path split_dotted(const std::string& name) {
  value_path p;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    p.emplace_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return p;
}

// [first, last] element of the storage a view touches; nullopt for an empty view.
std::optional<std::pair<int64_t, int64_t>> extent(const tensor_record& t) {
  int64_t last = t.storage_offset;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] == 0) return std::nullopt;
    last += (t.shape[d] - 1) * t.stride[d];
  }
  return std::make_pair(t.storage_offset, last);
}

[[noreturn]] void refuse(const site& s, const std::string& why) {
  throw error(errc::unsupported, "tensor " + s.name + " (neither parameter nor buffer): " + why);
}

}  // namespace

model_file_fill fill_from_model_file(torch::jit::Module& m, const checkpoint& model_file,
                                     const std::unordered_map<const void*, at::Tensor>& filled,
                                     const std::unordered_map<std::string, at::Tensor>& filled_by_name,
                                     const load_options& options) {
  model_file_fill result;
  attribute_walker attributes(/*with_parameters=*/false);
  attributes.walk_module(m);
  const zip::archive* ar = model_file.single_file("--model").zip.get();
  std::vector<constant_default> defaults = ar ? find_constant_defaults(*ar) : std::vector<constant_default>{};
  constant_sites constants = find_constant_sites(m, &defaults);

  std::vector<site> sites = std::move(attributes.sites);
  for (site& s : constants.sites) sites.push_back(std::move(s));

  // One value per tensor object: every site holding the same meta tensor gets the same one.
  std::vector<const void*> order;
  std::unordered_map<const void*, std::vector<size_t>> sites_of;
  for (size_t i = 0; i < sites.size(); ++i) {
    if (!sites[i].tensor.is_meta()) continue;
    const void* key = sites[i].tensor.unsafeGetTensorImpl();
    auto [it, fresh] = sites_of.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.push_back(i);
  }

  const record_index records(model_file);
  // Storages of the model file's own parameters and buffers, which the checkpoint replaced.
  std::unordered_map<size_t, std::pair<std::string, size_t>> parameter_storage;
  for (const auto& [name, value] : filled_by_name)
    if (auto r = records.find(split_dotted(name)))
      if (const auto& st = model_file.tensors[*r].storage) parameter_storage.emplace(*st, std::make_pair(name, *r));

  struct plan {
    const void* key;
    size_t first_site;
    std::optional<size_t> record;  // from the model file's record
    at::Tensor value;              // already known (a parameter or buffer object)
  };
  std::vector<plan> plans;
  std::vector<bool> needed(model_file.storages.size(), false);
  for (const void* key : order) {
    const std::vector<size_t>& group = sites_of[key];
    const site& first = sites[group.front()];
    plan p{key, group.front(), std::nullopt, at::Tensor()};
    if (!first.set) refuse(first, "LibTorch keeps it where it cannot be replaced");
    if (auto f = filled.find(key); f != filled.end()) {
      p.value = f->second;  // the very tensor object of a parameter or buffer
      plans.push_back(std::move(p));
      continue;
    }
    for (size_t i : group) {
      if (!sites[i].set) refuse(sites[i], "LibTorch keeps it where it cannot be replaced");
      if (!p.record && sites[i].path) p.record = records.find(*sites[i].path);
    }
    if (!p.record) refuse(first, "its record in the model file cannot be told exactly");
    const tensor_record& rec = model_file.tensors[*p.record];
    if (rec.quant) refuse(first, "quantized tensors outside parameters and buffers are not supported");
    if (rec.storage && !parameter_storage.count(*rec.storage)) needed[*rec.storage] = true;
    plans.push_back(std::move(p));
  }

  load_options o = options;
  o.progress = nullptr;  // the progress shown is the checkpoint's
  o.mmap = false;
  o.populate = false;
  std::vector<at::Tensor> storages = load_storages(model_file, needed, o);

  for (plan& p : plans) {
    const site& first = sites[p.first_site];
    if (!p.value.defined()) {
      const tensor_record& rec = model_file.tensors[*p.record];
      auto shared = rec.storage ? parameter_storage.find(*rec.storage) : parameter_storage.end();
      if (shared != parameter_storage.end()) {
        // A view of a parameter's storage (`self.w_t = self.lin.weight.t()` in __init__):
        // it sees what the parameter holds, the checkpoint's values.
        const at::Tensor& param = filled_by_name.at(shared->second.first);
        const tensor_record& prec = model_file.tensors[shared->second.second];
        auto a = extent(rec), pe = extent(prec);
        if (rec.quant || prec.quant || !is_row_major(prec) || !param.is_contiguous() ||
            (a && (!pe || a->first < pe->first || a->second > pe->second)))
          refuse(first, "it shares storage with parameter " + shared->second.first +
                            " in a way that cannot be carried over to the checkpoint's tensor");
        const int64_t offset = param.storage_offset() + (rec.storage_offset - prec.storage_offset);
        p.value = at::empty({0}, param.options().requires_grad(false)).set_(param.storage(), offset, rec.shape, rec.stride);
      } else {
        p.value = view_of(rec, storages, options.device);
      }
      // Floating and complex tensors can require grad (torch refuses it on integers only).
      if (first.tensor.requires_grad() && (at::isFloatingType(p.value.scalar_type()) || at::isComplexType(p.value.scalar_type())) &&
          !p.value.requires_grad())
        p.value.requires_grad_(true);
      result.names.push_back(first.name);
    }
    for (size_t i : sites_of[p.key]) sites[i].set(p.value);
  }
  for (const auto& e : constants.edits) apply(*e);

  if (!options.device.is_meta()) {
    std::vector<std::string> left = meta_tensors_left(m, 3);
    if (!left.empty())
      throw error(errc::unsupported, "tensor " + left.front() + " is still on meta after filling the model" +
                                         (left.size() > 1 ? " (and more)" : "") +
                                         "; ckptool cannot fill it from the checkpoint or the model file");
  }
  return result;
}

std::vector<std::string> meta_tensors_left(const torch::jit::Module& m, size_t limit) {
  std::vector<std::string> out;
  attribute_walker attributes(/*with_parameters=*/true);
  attributes.walk_module(m);
  constant_sites constants = find_constant_sites(m, nullptr);
  for (const auto* list : {&attributes.sites, &constants.sites})
    for (const site& s : *list)
      if (s.tensor.is_meta() && out.size() < limit) out.push_back(s.name);
  return out;
}

}  // namespace ckpt::detail
