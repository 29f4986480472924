#include "ckpt/load.h"

#include <map>
#include <set>
#include <unordered_map>

#include "aten_types.h"
#include "ckpt/error.h"
#include "ckpt/rekey.h"
#include "ckpt/torchscript_module.h"
#include "storage_loader.h"

namespace ckpt {
namespace {

// Names for every tensor: state-dict keys where there is a state dict, paths elsewhere.
std::vector<std::pair<std::string, size_t>> named_tensors(const checkpoint& c) {
  std::vector<std::pair<std::string, size_t>> out = c.state_dict_tensors();
  std::vector<bool> named(c.tensors.size(), false);
  for (auto& [k, i] : out) named[i] = true;
  for (size_t i = 0; i < c.tensors.size(); ++i)
    if (!named[i]) out.emplace_back(path_to_string(c.tensors[i].path), i);
  return out;
}

at::Tensor finish(at::Tensor t, const load_options& o) {
  if (o.dtype && at::isFloatingType(t.scalar_type()) && t.scalar_type() != *o.dtype) return t.to(*o.dtype);
  return t;
}

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

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> load_tensors(const checkpoint& c, const load_options& o) {
  std::vector<bool> needed(c.storages.size(), true);
  std::vector<at::Tensor> storages = detail::load_storages(c, needed, o);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, i] : named_tensors(c)) {
    at::Tensor t = detail::view_of(c.tensors[i], storages, o.device);
    out.emplace_back(name, finish(std::move(t), o));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> load_tensors(const std::string& path, const load_options& o) {
  return load_tensors(open_checkpoint(path), o);
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
  torch::jit::Module m = load_on_meta(model_path, *model_file.zip);

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

  std::vector<keyed_tensor> have;
  std::unordered_map<std::string, size_t> tensor_of_key;
  for (auto& [key, i] : c.state_dict_tensors()) {
    have.push_back({key, c.tensors[i].type, c.tensors[i].shape});
    tensor_of_key[key] = i;
  }
  if (have.empty()) throw error(errc::unsupported, "no state dict found in the checkpoint").with_file(c.path);
  match_result match = match_keys(have, wanted);
  if (!match.ambiguity.empty())
    throw error(errc::check_failed, "cannot align the checkpoint to the model: " + match.ambiguity).with_file(c.path);
  r.key_edit = match.edit;
  r.missing = match.missing;
  r.unexpected = match.unexpected;
  r.shape_mismatched = match.shape_mismatches;
  if (!r.shape_mismatched.empty())
    throw error(errc::check_failed, std::to_string(r.shape_mismatched.size()) + " tensors differ in shape from the model: " +
                                        r.shape_mismatched.front())
        .with_file(c.path);
  if (strict && !r.missing.empty())
    throw error(errc::check_failed, std::to_string(r.missing.size()) + " model tensors are missing from the checkpoint (" +
                                        r.missing.front() + (r.missing.size() > 1 ? ", ..." : "") +
                                        "); --no-strict fills them from the model file")
        .with_file(c.path);

  // Read only the storages the model uses.
  std::map<std::string, std::string> target_to_source;
  for (auto& [src, dst] : match.mapping) target_to_source[dst] = src;
  std::vector<bool> needed(c.storages.size(), false);
  for (auto& [dst, src] : target_to_source) {
    const tensor_record& t = c.tensors[tensor_of_key.at(src)];
    if (t.storage) needed[*t.storage] = true;
  }
  std::vector<at::Tensor> storages = detail::load_storages(c, needed, o);
  for (size_t i = 0; i < needed.size(); ++i)
    if (needed[i]) r.bytes += c.storages[i].nbytes;

  // Missing tensors (non-strict) come from the model file's own records.
  std::vector<at::Tensor> model_storages;
  std::unordered_map<std::string, size_t> model_tensor_of_name;
  if (!r.missing.empty()) {
    std::vector<bool> model_needed(model_file.storages.size(), false);
    for (size_t i = 0; i < model_file.tensors.size(); ++i) {
      std::string dotted;
      for (const auto& step : model_file.tensors[i].path)
        dotted += (dotted.empty() ? "" : ".") +
                  (std::holds_alternative<std::string>(step) ? std::get<std::string>(step) : std::to_string(std::get<int64_t>(step)));
      model_tensor_of_name[dotted] = i;
    }
    for (const auto& name : r.missing) {
      auto it = model_tensor_of_name.find(name);
      if (it == model_tensor_of_name.end() || !model_file.tensors[it->second].storage)
        throw error(errc::check_failed, "model tensor " + name + " is in neither the checkpoint nor the model file").with_file(model_path);
      model_needed[*model_file.tensors[it->second].storage] = true;
    }
    model_storages = detail::load_storages(model_file, model_needed, o);
  }

  for (const auto& t : targets) {
    at::Tensor value;
    auto src = target_to_source.find(t.name);
    if (src != target_to_source.end()) {
      value = detail::view_of(c.tensors[tensor_of_key.at(src->second)], storages, o.device);
    } else {
      value = detail::view_of(model_file.tensors[model_tensor_of_name.at(t.name)], model_storages, o.device);
      r.filled_from_model.push_back(t.name);
    }
    c10::ScalarType want = o.dtype && at::isFloatingType(t.meta.scalar_type()) ? *o.dtype : t.meta.scalar_type();
    if (value.scalar_type() != want) {
      r.dtype_converted.push_back(t.name + ": " + c10::toString(value.scalar_type()) + " -> " + c10::toString(want));
      value = value.to(want);
    }
    if (t.meta.requires_grad() && at::isFloatingType(value.scalar_type())) value.requires_grad_(true);
    auto [module_path, attr] = split_name(t.name);
    torch::jit::Module owner = submodule(m, module_path);
    if (t.is_buffer)
      owner.register_buffer(attr, value);
    else
      owner.register_parameter(attr, value, /*is_buffer=*/false);
  }
  return m;
}

torch::jit::Module load_module(const std::string& model_path, const std::string& checkpoint_path, const load_options& o,
                               bool strict, module_load_report* report) {
  return load_module(model_path, open_checkpoint(checkpoint_path), o, strict, report);
}

}  // namespace ckpt
