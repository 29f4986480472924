#include "ckpt/load.h"

#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "torch/aten_types.h"
#include "base/text.h"
#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "ckpt/rekey.h"
#include "torch/torchscript_module.h"
#include "torch/model_file_tensors.h"
#include "torch/named_tensors.h"
#include "model/assembly.h"
#include "model/read_plan.h"
#include "torch/loader/assembled_loader.h"
#include "torch/loader/storage_loader.h"

namespace ckpt {
namespace detail {

namespace {

std::string place_of(const checkpoint& c, const named_tensor& n) {
  if (n.by_path) return "the tensor at '" + n.name + "' (outside the state dict)";
  if (c.state_dict && !c.state_dict->empty())
    return "key '" + n.name + "' of the state dict at '" + path_to_string(*c.state_dict) + "'";
  return "state dict key '" + n.name + "'";
}

// A tensor outside the state dict is named by its path, which can equal a key of a state
// dict below the root ({'w': t1, 'opt': {'w': t2}}). A name -> tensor result would then hold
// one of the two, and -o would write the name twice (torch.load keeps the last): silently
// one tensor fewer. Refused, naming both places; the same tensor under one name twice is
// no conflict.
void refuse_shared_names(const checkpoint& c, const std::vector<named_tensor>& names) {
  // Keys are unique among themselves: only a name by path can meet another. Those are few
  // (a million keys and no such name: no table at all, which the bounded load counts on).
  std::unordered_map<std::string_view, const named_tensor*> by_path;
  for (const named_tensor& n : names) {
    if (!n.by_path) continue;
    auto [it, fresh] = by_path.emplace(n.name, &n);
    if (!fresh && it->second->tensor != n.tensor)
      throw_unsupported("two different tensors would both be named '" + n.name + "': " + place_of(c, *it->second) +
                        " and " + place_of(c, n) + "; ckptool does not pick one of them");
  }
  if (by_path.empty()) return;
  for (const named_tensor& n : names) {
    if (n.by_path) continue;
    auto it = by_path.find(n.name);
    if (it == by_path.end()) continue;
    const named_tensor& m = *it->second;
    if (!n.assembled && m.tensor == n.tensor) continue;  // one tensor under one name twice
    throw_unsupported("two different tensors would both be named '" + n.name + "': " + place_of(c, n) + " and " +
                      place_of(c, m) + "; ckptool does not pick one of them");
  }
}

}  // namespace

// Names for every tensor: state-dict keys where there is a state dict (a tied tensor
// under each of its keys), paths elsewhere, and every further path the pickle shares a
// tensor object under. The records that are pieces of assembled keys are parts of those
// keys' tensors, not tensors of their own.
std::vector<named_tensor> named_tensors(const checkpoint& c) {
  // A load that left them out would return a state dict without them, as if complete.
  for (const entry_summary& e : c.entries)
    if (e.tensors_inside)
      throw_unsupported("the DCP item '" + path_to_string(e.path) + "' holds " + std::to_string(e.tensors_inside) +
                        (e.tensors_inside == 1 ? " tensor" : " tensors") +
                        " inside its pickled value (a save with flatten_state_dict=False), which ckptool does not "
                        "load; torch.distributed.checkpoint.format_utils.dcp_to_torch_save does");
  std::vector<named_tensor> out;
  out.reserve(c.keys.size());
  std::vector<bool> named(c.tensors.size(), false);
  for (size_t k = 0; k < c.keys.size(); ++k) {
    if (!detail::is_assembled(c.keys, k)) {
      out.push_back({std::string(c.keys.key(k)), c.keys.tensor(k), false, 0});
      named[out.back().tensor] = true;
      continue;
    }
    out.push_back({std::string(c.keys.key(k)), 0, true, k});
    for (size_t p = 0; p < c.keys.piece_count(k); ++p) {
      const size_t i = c.keys.piece(k, p).tensor;
      if (i < named.size()) named[i] = true;
    }
  }
  // A pickled module's tensors that its state_dict() leaves out (non-persistent buffers,
  // plain tensor attributes) stay out, so the result loads with load_state_dict(strict=True).
  auto in_module = [&](const value_path& p) {
    return !c.module_class.empty() && c.module_unread.empty() && p.size() > c.state_dict->size() &&
           std::equal(c.state_dict->begin(), c.state_dict->end(), p.begin());
  };
  for (size_t i = 0; i < c.tensors.size(); ++i)
    if (!named[i] && !in_module(c.tensors[i].path)) out.push_back({path_to_string(c.tensors[i].path), i, false, 0, true});
  auto in_state_dict = [&](const value_path& p) {
    return in_module(p) || (c.state_dict && p.size() == c.state_dict->size() + 1 &&
                            std::equal(c.state_dict->begin(), c.state_dict->end(), p.begin()));
  };
  for (const auto& a : c.aliases)
    if (!in_state_dict(a.path)) out.push_back({path_to_string(a.path), a.tensor, false, 0, true});
  refuse_shared_names(c, out);
  return out;
}

}  // namespace detail

namespace {

using detail::named_tensor;
using detail::named_tensors;

std::string dtype_text(c10::ScalarType t) { return c10::getDtypeNames(t).first; }

// --dtype casts a storage once, then rebuilds every view over the cast copy: tied tensors
// stay tied and views keep their strides and offsets (elementwise casts keep positions).
class storage_caster {
 public:
  explicit storage_caster(std::optional<c10::ScalarType> to) : to_(to) {}

  at::Tensor apply(const at::Tensor& t, std::vector<std::string>* report, const std::string& name) {
    if (!to_ || !at::isFloatingType(t.scalar_type()) || t.scalar_type() == *to_) return t;
    if (report) report->push_back(name + ": " + dtype_text(t.scalar_type()) + " -> " + dtype_text(*to_));
    // Sparse tensors own no storage of their own: their values are cast (a new tensor).
    if (t.is_meta() || t.layout() != at::kStrided) return t.to(*to_);
    const void* key = t.storage().unsafeGetStorageImpl();
    auto it = cast_.find(key);
    if (it == cast_.end()) {
      int64_t numel = int64_t(t.storage().nbytes() / t.element_size());
      at::Tensor whole = at::empty({0}, t.options()).set_(t.storage(), 0, {numel}, {1});
      it = cast_.emplace(key, whole.to(*to_)).first;
    }
    const at::Tensor& cast = it->second;
    at::Tensor view = at::empty({0}, cast.options()).set_(cast.storage(), t.storage_offset(), t.sizes(), t.strides());
    // The cast read the stored bytes (`whole` has no bits); negation commutes with the cast.
    if (t.is_conj()) view._set_conj(true);
    if (t.is_neg()) view._set_neg(true);
    return view;
  }

 private:
  std::optional<c10::ScalarType> to_;
  std::unordered_map<const void*, at::Tensor> cast_;
};

// "enc.0.weight" -> (module "enc.0", attribute "weight").
std::pair<std::string, std::string> split_name(const std::string& name) {
  size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

torch::jit::Module submodule(torch::jit::Module m, const std::string& path) {
  if (path.empty()) return m;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    m = m.attr(part).toModule();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return m;
}

// A torch.export archive's pickled tensors (use_pickle) are part of its state dict or its
// constants, but only an unpickler reads them: a result without them would look complete.
void refuse_pickled_pt2_tensors(const checkpoint& c) {
  if (!c.pt2) return;
  for (const pt2::model& m : c.pt2->models)
    for (const pt2::opaque_entry& e : m.opaque)
      if (e.what.rfind("pickled", 0) == 0)
        throw error(errc::unsupported, "'" + m.key_prefix + e.fqn + "' is a pickled tensor (use_pickle, " + e.file +
                                           "), which ckptool does not unpickle; the other tensors alone would not be "
                                           "the archive's state")
            .with_file(c.path);
}

// The tensors of c under `names` (named_tensors).
std::vector<std::pair<std::string, at::Tensor>> load_named(const checkpoint& c, std::vector<named_tensor> names,
                                                          const load_options& o, std::vector<std::string>* converted) {
  refuse_pickled_pt2_tensors(c);
  std::vector<size_t> viewed, assembled_keys;
  for (const named_tensor& n : names) {
    if (n.assembled)
      assembled_keys.push_back(n.key);
    else
      viewed.push_back(n.tensor);
  }
  detail::loaded_tensors loaded =
      detail::load_with_pieces(c, std::vector<bool>(c.storages.size(), true), viewed, assembled_keys, o);
  std::vector<at::Tensor>& storages = loaded.storages;
  // Each storage's byte tensor is dropped once the last view of it is made: the views keep
  // the storage, and a million one-element tensors should not hold a million extra
  // TensorImpls until the end. Quantizer tensors (per-channel scales) are built from these
  // too, so a quantized tensor's storages are kept to the end.
  std::vector<size_t> views_left(c.storages.size(), 0);
  bool quantized = false;
  for (const tensor_record& t : c.tensors) {
    if (t.storage) ++views_left[*t.storage];
    quantized = quantized || t.quant || t.composite();
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(names.size());
  std::vector<at::Tensor> by_record(c.tensors.size());
  storage_caster caster(o.dtype);
  for (named_tensor& n : names) {
    std::string& name = n.name;
    if (n.assembled) {
      at::Tensor t = caster.apply(loaded.assembled.at(n.key), converted, name);
      out.emplace_back(std::move(name), std::move(t));
      continue;
    }
    const size_t i = n.tensor;
    // A tensor object reached under several names stays one tensor object.
    if (!by_record[i].defined()) {
      by_record[i] = caster.apply(detail::view_of(c.tensors[i], storages, o.device), converted, name);
      const auto& s = c.tensors[i].storage;
      if (s && !quantized && --views_left[*s] == 0) storages[*s] = at::Tensor();
    }
    out.emplace_back(std::move(name), by_record[i]);
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> load_tensors(const checkpoint& c, const load_options& o,
                                                          std::vector<std::string>* converted) {
  return load_named(c, named_tensors(c), o, converted);
}

std::vector<std::pair<std::string, at::Tensor>> load_tensors_releasing(checkpoint& c, const load_options& o,
                                                                       std::vector<std::string>* converted) {
  auto names = named_tensors(c);
  release_pickle(c);
  return load_named(c, std::move(names), o, converted);
}

std::vector<std::pair<std::string, at::Tensor>> load_tensors(const checkpoint& c, const load_options& o) {
  return load_tensors(c, o, nullptr);
}

namespace {

bool plain_value(const pickle::value* v, int depth) {
  using pickle::kind;
  if (!v || depth > 32) return false;
  switch (v->type) {
    case kind::none: case kind::boolean: case kind::integer: case kind::big_integer:
    case kind::floating: case kind::str: case kind::bytes:
      return true;
    case kind::tuple: case kind::list: case kind::dict:
      if (v->state || (v->type == kind::dict && v->flag)) return false;
      for (const pickle::value* x : v->items)
        if (!plain_value(x, depth + 1)) return false;
      return true;
    default:
      return false;
  }
}

bool empty_state(const pickle::value* v) {
  using pickle::kind;
  if (!v || v->type == kind::none) return true;
  if (v->type == kind::dict || v->type == kind::tuple) {
    for (const pickle::value* x : v->items)
      if (!empty_state(x)) return false;
    return true;
  }
  return false;
}

// The state argument of _rebuild_parameter_with_state / _rebuild_from_type_v2 (both 4th).
const pickle::value* python_state(const tensor_record& t) {
  // A DTensor's state is its local tensor and spec, which materialize gives as the plain
  // local tensor: not attributes to keep.
  if (t.kind) return nullptr;
  const pickle::value* fn = t.node ? t.node->callable_global() : nullptr;
  if (!fn || !(fn->is_global("torch._utils", "_rebuild_parameter_with_state") ||
               fn->is_global("torch._tensor", "_rebuild_from_type_v2")))
    return nullptr;
  const pickle::value* args = t.node->items[pickle::kArgs];
  if (!args || args->type != pickle::kind::tuple || args->items.size() != 4) return nullptr;
  const pickle::value* state = args->items[3];
  if (empty_state(state)) return nullptr;
  if (!plain_value(state, 0))
    throw error(errc::unsupported,
                "tensor " + path_to_string(t.path) +
                    ": its Python attributes hold objects other than plain values, which cannot be written back exactly",
                state->offset);
  return state;
}

}  // namespace

std::vector<tensor_state> tensor_states(const checkpoint& c) {
  std::vector<tensor_state> out;
  for (const named_tensor& n : named_tensors(c)) {
    // A module's state_dict() holds detached tensors: no Parameter, no requires_grad. An
    // assembled tensor is plain: its pieces' records are parts, not Python objects.
    if (n.assembled || (!c.module_class.empty() && out.size() < c.keys.size())) {
      out.push_back({false, false, nullptr});
      continue;
    }
    const tensor_record& t = c.tensors[n.tensor];
    out.push_back({t.parameter, t.requires_grad, python_state(t)});
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> load_tensors(const std::string& path, const load_options& o) {
  checkpoint c = open_checkpoint(path);
  return load_tensors_releasing(c, o, nullptr);
}

torch::jit::Module load_module(const std::string& model_path, const checkpoint& c, const load_options& o, bool strict,
                               module_load_report* report) {
  module_load_report local;
  module_load_report& r = report ? *report : local;
  detail::check_device(o.device);
  checkpoint model_file = open_checkpoint(model_path);
  if (model_file.format != file_format::torchscript)
    throw error(errc::usage, "--model must be a TorchScript archive (torch.jit.save); this is " +
                                 std::string(format_name(model_file.format)))
        .with_file(model_path);
  torch::jit::Module m = load_on_meta(model_path, *model_file.single_file("--model").zip, nullptr, o.allow_code);
  if (o.model_built) o.model_built();

  // The model's tensors, as the solver sees them.
  struct target {
    std::string name;
    bool is_buffer;
    at::Tensor meta;
  };
  std::vector<target> targets;
  std::vector<keyed_tensor> wanted;
  for (const auto& p : m.named_parameters(true)) targets.push_back({p.name, false, p.value});
  for (const auto& b : m.named_buffers(true)) targets.push_back({b.name, true, b.value});
  for (const auto& t : targets)
    wanted.push_back({t.name, detail::from_scalar_type(t.meta.scalar_type()), t.meta.sizes().vec()});

  // Aligned by key: an assembled key by its own dtype and global shape.
  std::vector<keyed_tensor> have;
  std::unordered_map<std::string, size_t> index_of_key;
  for (size_t k = 0; k < c.keys.size(); ++k) {
    have.push_back({std::string(c.keys.key(k)), c.keys.type(k, c.tensors), c.keys.shape(k, c.tensors)});
    index_of_key[have.back().key] = k;
  }
  if (have.empty()) throw error(errc::unsupported, "no state dict found in the checkpoint").with_file(c.path);
  align_policy policy;
  policy.target = "the model";
  policy.target_noun = "model";
  policy.allow_missing = !strict;
  policy.allow_unexpected = true;  // a checkpoint may hold more than the model reads
  policy.missing_hint = "; --no-strict fills them from the model file";
  match_result match = align_keys(have, wanted, policy, c.path);
  r.key_edit = match.edit;
  r.missing = match.missing;
  r.unexpected = match.unexpected;
  r.shape_mismatched = match.shape_mismatches;

  // Read only the storages the model uses.
  std::map<std::string, std::string> target_to_source;
  for (auto& [src, dst] : match.mapping) target_to_source[dst] = src;
  std::vector<size_t> selected, assembled_keys;
  for (auto& [dst, src] : target_to_source) {
    const size_t k = index_of_key.at(src);
    if (detail::is_assembled(c.keys, k))
      assembled_keys.push_back(k);
    else
      selected.push_back(c.keys.tensor(k));
  }
  // The keys' storages: per-channel quantizers' scales and zero points, and the component
  // tensors of sparse ones, included.
  std::vector<bool> needed = detail::storages_of(c, selected);
  if (!o.device.is_meta())
    for (size_t i = 0; i < needed.size(); ++i)
      if (needed[i]) r.bytes += c.storages[i].nbytes;
  detail::loaded_tensors loaded = detail::load_with_pieces(c, std::move(needed), selected, assembled_keys, o);
  std::vector<at::Tensor>& storages = loaded.storages;
  if (!o.device.is_meta()) r.bytes += loaded.piece_bytes;

  // Parameters the model ties (one tensor object under several names): the names of each,
  // in the model's order. A tie is filled once, from whichever of its names the checkpoint
  // holds; load_state_dict would copy every one of them into the one tensor.
  std::unordered_map<const void*, std::vector<std::string>> tie_names;
  for (const auto& t : targets) tie_names[t.meta.unsafeGetTensorImpl()].push_back(t.name);
  auto sources_of = [&](const target& t) {
    std::vector<std::string> out;
    for (const std::string& name : tie_names.at(t.meta.unsafeGetTensorImpl())) {
      auto it = target_to_source.find(name);
      if (it != target_to_source.end()) out.push_back(it->second);
    }
    return out;
  };

  // Ties none of whose names the checkpoint holds (non-strict) come from the model file's
  // own records, which hold a tie once, under one of its names.
  std::vector<at::Tensor> model_storages;
  std::unordered_map<std::string, size_t> model_tensor_of_name;
  std::unordered_map<const void*, size_t> model_tensor_of_tie;
  if (!r.missing.empty()) {
    for (size_t i = 0; i < model_file.tensors.size(); ++i)
      if (model_file.tensors[i].storage) model_tensor_of_name[path_to_string(model_file.tensors[i].path, '.')] = i;
    std::vector<size_t> model_selected;
    for (const auto& t : targets) {
      const void* tie = t.meta.unsafeGetTensorImpl();
      if (model_tensor_of_tie.count(tie) || !sources_of(t).empty()) continue;
      std::optional<size_t> record;
      for (const std::string& name : tie_names.at(tie)) {
        auto it = model_tensor_of_name.find(name);
        if (it != model_tensor_of_name.end()) {
          record = it->second;
          break;
        }
      }
      if (!record)
        throw error(errc::check_failed, "model tensor " + t.name + " is in neither the checkpoint nor the model file")
            .with_file(model_path);
      model_tensor_of_tie[tie] = *record;
      model_selected.push_back(*record);
    }
    model_storages = detail::load_storages(model_file, detail::storages_of(model_file, model_selected), o);
  }
  auto checkpoint_value = [&](const std::string& key) {
    const size_t k = index_of_key.at(key);
    return detail::is_assembled(c.keys, k) ? loaded.assembled.at(k)
                                           : detail::view_of(c.tensors[c.keys.tensor(k)], storages, o.device);
  };

  storage_caster caster(o.dtype);
  // Parameters the model ties (one tensor object under two names) stay one object.
  std::unordered_map<const void*, at::Tensor> filled;
  for (const auto& t : targets) {
    auto tied = filled.find(t.meta.unsafeGetTensorImpl());
    if (tied != filled.end()) {
      auto [module_path, attr] = split_name(t.name);
      torch::jit::Module owner = submodule(m, module_path);
      if (t.is_buffer)
        owner.register_buffer(attr, tied->second);
      else
        owner.register_parameter(attr, tied->second, /*is_buffer=*/false);
      continue;
    }
    at::Tensor value;
    const std::vector<std::string> sources = sources_of(t);
    if (!sources.empty()) {
      value = checkpoint_value(sources.front());
      // Checkpoint values that differ for names of one tie: load_state_dict would keep the
      // last one copied, an order no checkpoint says it relies on. Refused (on the meta
      // device there are no values to tell apart).
      for (size_t i = 1; i < sources.size() && !o.device.is_meta(); ++i) {
        const at::Tensor other = checkpoint_value(sources[i]);
        if (other.scalar_type() != value.scalar_type() || !other.sizes().equals(value.sizes()) || !other.equal(value))
          throw error(errc::check_failed, "the model ties " + text::join_names(tie_names.at(t.meta.unsafeGetTensorImpl()), 4) +
                                              " (one tensor), but the checkpoint holds different values for '" +
                                              sources.front() + "' and '" + sources[i] +
                                              "': which one the model should get is not for ckptool to guess")
              .with_file(c.path);
      }
    } else {
      value = detail::view_of(model_file.tensors[model_tensor_of_tie.at(t.meta.unsafeGetTensorImpl())], model_storages,
                              o.device);
      r.filled_from_model.push_back(t.name);
    }
    c10::ScalarType want = o.dtype && at::isFloatingType(t.meta.scalar_type()) ? *o.dtype : t.meta.scalar_type();
    if (value.scalar_type() != want) {
      if (at::isFloatingType(value.scalar_type()) && o.dtype && want == *o.dtype) {
        value = caster.apply(value, &r.dtype_converted, t.name);
      } else {
        r.dtype_converted.push_back(t.name + ": " + dtype_text(value.scalar_type()) + " -> " + dtype_text(want));
        value = value.to(want);
      }
    }
    // Floating and complex tensors can require grad (a complex nn.Parameter does).
    if (t.meta.requires_grad() && (at::isFloatingType(value.scalar_type()) || at::isComplexType(value.scalar_type())))
      value.requires_grad_(true);
    filled.emplace(t.meta.unsafeGetTensorImpl(), value);
    auto [module_path, attr] = split_name(t.name);
    torch::jit::Module owner = submodule(m, module_path);
    if (t.is_buffer)
      owner.register_buffer(attr, value);
    else
      owner.register_parameter(attr, value, /*is_buffer=*/false);
  }

  // What no state dict holds (tensor attributes, the code's tensor constants) comes from
  // the model file whatever --strict says: a checkpoint is not expected to have it.
  std::unordered_map<std::string, at::Tensor> filled_by_name;
  for (const auto& t : targets) filled_by_name.emplace(t.name, filled.at(t.meta.unsafeGetTensorImpl()));
  try {
    r.from_model_file = detail::fill_from_model_file(m, model_file, filled, filled_by_name, o).names;
  } catch (error& e) {
    e.with_file(model_path);
    throw;
  }
  return m;
}

torch::jit::Module load_module(const std::string& model_path, const std::string& checkpoint_path, const load_options& o,
                               bool strict, module_load_report* report) {
  return load_module(model_path, open_checkpoint(checkpoint_path), o, strict, report);
}

}  // namespace ckpt
