#include "pickled_module.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "ckpt/error.h"
#include "pointer_map.h"

namespace ckpt::detail {
namespace {

using pickle::kind;
using pickle::value;

const char* const kModuleHolders[] = {"model", "module", "net", "network", "model_ema", "ema"};

const value* str_key(const value* d, std::string_view key) {
  if (!d || d->type != kind::dict) return nullptr;
  for (size_t i = 0; i < d->dict_size(); ++i)
    if (d->dict_key(i)->type == kind::str && d->dict_key(i)->text == key) return d->dict_value(i);
  return nullptr;
}

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

struct pending {
  const value* attrs;
  std::string prefix;
  uint64_t depth;
};

}  // namespace

void find_pickled_module(checkpoint& c, const open_options& options) {
  const value* root = c.pickle ? c.pickle->root : nullptr;
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

  pointer_map<size_t> tensor_of(c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) tensor_of.insert(c.tensors[i].node, i);

  // Module.state_dict() with the default _save_to_state_dict: each module's parameters,
  // then its persistent buffers (None skipped), then its submodules' in order, depth first;
  // a tensor shared by two modules is under both keys, as state_dict() gives it.
  std::vector<std::pair<std::string, size_t>> keys;
  std::vector<pending> stack{{module_attrs(module), "", 0}};
  // A module shared under several names is visited under each, as state_dict() does; a
  // pickle can share one exponentially often at a few bytes a level, so visits are bounded.
  const uint64_t max_visits = options.max_tensors + c.pickle->node_count();
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
    // A module inside itself: torch.load gives it, but its state_dict() never returns
    // (RecursionError), so there are no keys to give; its tensors stay listed by path.
    on_path.resize(p.depth);
    if (std::find(on_path.begin(), on_path.end(), p.attrs) != on_path.end()) return;
    on_path.push_back(p.attrs);
    if (has_state_dict_hooks(p.attrs)) return;  // keys we cannot know: tensors stay listed by path
    std::unordered_set<std::string_view> non_persistent;
    if (const value* set = str_key(p.attrs, "_non_persistent_buffers_set"))
      for (const value* n : set->items)
        if (n->type == kind::str) non_persistent.insert(n->text);
    auto persistent = [&](const value* name) { return name->type != kind::str || !non_persistent.count(name->text); };
    for (const char* registry : {"_parameters", "_buffers"}) {
      const value* d = str_key(p.attrs, registry);
      bool buffers = registry[1] == 'b';
      for (size_t i = 0; i < d->dict_size(); ++i) {
        const value* name = d->dict_key(i);
        const value* t = d->dict_value(i);
        if (t->type == kind::none || (buffers && !persistent(name))) continue;
        std::string key = p.prefix + (name->type == kind::str ? name->text : pickle::repr(name, 80));
        const size_t* index = tensor_of.find(t);
        if (!index)
          throw_unsupported("pickled nn.Module: " + std::string(buffers ? "buffer" : "parameter") + " '" + key +
                                "' is not a tensor ckptool can read",
                            t->offset);
        if (keys.size() >= options.max_tensors)
          throw_limit("pickled nn.Module's state_dict() has more than " + std::to_string(options.max_tensors) +
                          " keys (raise with --max-tensors)",
                      t->offset);
        keys.emplace_back(std::move(key), *index);
      }
    }
    const value* children = str_key(p.attrs, "_modules");
    for (size_t i = children->dict_size(); i-- > 0;) {
      const value* child = children->dict_value(i);
      if (child->type == kind::none) continue;
      const value* attrs = module_attrs(child);
      const value* name = children->dict_key(i);
      std::string prefix = p.prefix + (name->type == kind::str ? name->text : pickle::repr(name, 80));
      if (!attrs) throw_unsupported("pickled nn.Module: submodule '" + prefix + "' is not an nn.Module", child->offset);
      stack.push_back({attrs, prefix + ".", p.depth + 1});
    }
  }
  c.module_class = class_name(module);
  c.module_keys = std::move(keys);
  c.state_dict = std::move(where);
  c.state_dict_node = module;
}

}  // namespace ckpt::detail
