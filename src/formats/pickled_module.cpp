#include "formats/pickled_module.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "ckpt/error.h"
#include "base/pointer_map.h"
#include "pickle/pickle_accessors.h"

namespace ckpt::detail {
namespace {

using pickle::kind;
using pickle::value;
using detail::str_key;

const char* const kModuleHolders[] = {"model", "module", "net", "network", "model_ema", "ema"};

// The attribute dict of an nn.Module (its BUILD state: Module.__dict__), or nullptr when
// `v` does not look like one. What makes a module is its three registries, whatever its class.
const value* module_attrs(const value* v) {
  if (!v || v->type != kind::object || !v->state || v->state->type != kind::dict) return nullptr;
  for (const char* registry : {"_parameters", "_buffers", "_modules"}) {
    const value* d = str_key(v->state, registry);
    if (!d || d->type != kind::dict) return nullptr;
  }
  return v->state;
}

// A hook in these can change state_dict()'s keys, and runs code we do not have.
bool has_state_dict_hooks(const value* attrs) {
  for (const char* hooks : {"_state_dict_hooks", "_state_dict_pre_hooks"}) {
    const value* d = str_key(attrs, hooks);
    if (d && (d->type != kind::dict || d->dict_size() > 0)) return true;
  }
  return false;
}

// NEWOBJ's class is a global, or in the legacy format the first time a class is pickled,
// the persistent id ('module', class, source file, source).
std::string class_name(const value* module) {
  const value* cls = module->items[pickle::kCallable];
  if (cls && cls->type == kind::persistent_id && !cls->items.empty() && cls->items[0]->type == kind::tuple &&
      cls->items[0]->items.size() == 4)
    cls = cls->items[0]->items[1];
  return cls && cls->type == kind::global ? cls->global_name() : "object";
}

// Classes of torch itself whose state dict is not their registries: quantized and
// observer modules override _save_to_state_dict (packed weights, scales), and so on.
bool saves_its_own_way(const std::string& cls) {
  return cls.rfind("torch.ao.", 0) == 0 || cls.rfind("torch.nn.quantized.", 0) == 0 ||
         cls.rfind("torch.nn.intrinsic.quantized.", 0) == 0 || cls.rfind("torch.quantization.", 0) == 0;
}

struct pending {
  const value* module;
  std::string prefix;
  uint64_t depth;
};

// Module.state_dict() with the default _save_to_state_dict: each module's parameters,
// then its persistent buffers (None skipped), then its submodules' in order, depth first;
// a tensor shared by two modules is under both keys, as state_dict() gives it. Returns why
// the keys cannot be known from the file, or "" with `keys` filled.
std::string state_dict_keys(const checkpoint& c, const pickle::document& doc, const open_options& options, const value* module,
                            std::vector<std::pair<std::string, size_t>>& keys) {
  pointer_map<size_t> tensor_of(c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) tensor_of.insert(c.tensors[i].node, i);
  std::vector<pending> stack{{module, "", 0}};
  // A module shared under several names is visited under each, as state_dict() does; a
  // pickle can share one exponentially often at a few bytes a level, so visits are bounded.
  const uint64_t max_visits = options.max_tensors + doc.node_count();
  uint64_t visits = 0;
  std::vector<const value*> on_path;  // the modules from the root to the one being visited
  while (!stack.empty()) {
    pending p = std::move(stack.back());
    stack.pop_back();
    if (++visits > max_visits)
      throw_limit("pickled nn.Module: its module tree reaches more than " + std::to_string(max_visits) +
                      " modules by path (raise with --max-tensors)",
                  module->offset);
    if (p.depth > options.pickle_limits.max_depth)
      throw_limit("pickled nn.Module nested deeper than " + std::to_string(options.pickle_limits.max_depth) +
                      " (raise with --max-depth)",
                  module->offset);
    std::string where = p.prefix.empty() ? "the root module" : "module '" + p.prefix.substr(0, p.prefix.size() - 1) + "'";
    on_path.resize(p.depth);
    if (std::find(on_path.begin(), on_path.end(), p.module) != on_path.end())
      return where + " contains itself, so its state_dict() never returns";
    on_path.push_back(p.module);
    const std::string cls = class_name(p.module);
    if (saves_its_own_way(cls)) return where + " is a " + cls + ", which writes its state dict its own way";
    const value* attrs = module_attrs(p.module);
    if (has_state_dict_hooks(attrs)) return where + " has state_dict hooks, which can change its keys";
    std::unordered_set<std::string_view> non_persistent;
    if (const value* set = str_key(attrs, "_non_persistent_buffers_set")) {
      // Membership in anything but a set of names would be that object's own __contains__,
      // which we cannot run: say so rather than guess which buffers state_dict() skips.
      if (set->type != kind::set && set->type != kind::frozenset)
        return where + "'s _non_persistent_buffers_set is not a set ckptool reads";
      for (const value* n : set->items)
        if (n && n->type == kind::str) non_persistent.insert(n->text);
    }
    auto persistent = [&](const value* name) { return name->type != kind::str || !non_persistent.count(name->text); };
    for (const char* registry : {"_parameters", "_buffers"}) {
      const value* d = str_key(attrs, registry);
      bool buffers = registry[1] == 'b';
      for (size_t i = 0; i < d->dict_size(); ++i) {
        const value* name = d->dict_key(i);
        const value* t = d->dict_value(i);
        if (t->type == kind::none || (buffers && !persistent(name))) continue;
        std::string key = p.prefix + (name->type == kind::str ? name->text : pickle::repr(name, 80));
        const size_t* index = tensor_of.find(t);
        if (!index) return std::string(buffers ? "buffer" : "parameter") + " '" + key + "' is not a tensor ckptool reads";
        if (keys.size() >= options.max_tensors)
          throw_limit("pickled nn.Module's state_dict() has more than " + std::to_string(options.max_tensors) +
                          " keys (raise with --max-tensors)",
                      t->offset);
        keys.emplace_back(std::move(key), *index);
      }
    }
    const value* children = str_key(attrs, "_modules");
    for (size_t i = children->dict_size(); i-- > 0;) {
      const value* child = children->dict_value(i);
      if (child->type == kind::none) continue;
      const value* name = children->dict_key(i);
      std::string prefix = p.prefix + (name->type == kind::str ? name->text : pickle::repr(name, 80));
      if (!module_attrs(child)) return "submodule '" + prefix + "' is not an nn.Module ckptool reads";
      stack.push_back({child, prefix + ".", p.depth + 1});
    }
  }
  return "";
}

}  // namespace

void find_pickled_module(checkpoint& c, const pickle::document* doc, const open_options& options) {
  const value* root = doc ? doc->root : nullptr;
  if (!root) return;
  value_path where;
  const value* module = module_attrs(root) ? root : nullptr;
  if (!module && root->type == kind::dict) {
    for (const char* holder : kModuleHolders)
      if (module_attrs(str_key(root, holder))) {
        module = str_key(root, holder);
        where = {std::string(holder)};
        break;
      }
  }
  if (!module) return;
  c.module_class = class_name(module);
  std::vector<std::pair<std::string, size_t>> keys;
  c.module_unread = state_dict_keys(c, *doc, options, module, keys);
  if (!c.module_unread.empty()) return;  // its tensors stay listed by path
  size_t text = 0;
  for (const auto& [key, i] : keys) text += key.size();
  c.keys.reserve(keys.size(), text);
  for (const auto& [key, i] : keys) c.keys.add(key, i);
  c.state_dict = std::move(where);
  c.state_dict_node = module;
}

}  // namespace ckpt::detail
