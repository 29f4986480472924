// Which checkpoint tensors replace which constants of an AOTInductor model, decided and
// checked before LibTorch sees anything: its swap copies whatever bytes it is handed
// into the constant's slot and re-labels them with the model's dtype and shape
// (formats.md §15.5), so every refusal has to happen here.
#include <map>
#include <set>

#include "ckpt/aoti.h"
#include "ckpt/error.h"
#include "ckpt/rekey.h"
#include "formats/aoti_package.h"

namespace ckpt::aoti {
namespace {

std::string first_few(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? ", " : "") + v[i];
  return v.size() > 6 ? s + ", ... (" + std::to_string(v.size()) + " in all)" : s;
}

// Inductor turns a 0-d tensor, or a 1-D one of at most 8 elements, into a literal in the
// generated code unless told to keep tensor constants (formats.md §15.3).
bool inlinable(const std::vector<int64_t>& shape) { return shape.empty() || (shape.size() == 1 && shape[0] <= 8); }

}  // namespace

swap_plan plan_swap(const checkpoint& c, const model& m, bool strict) {
  std::vector<keyed_tensor> source = keyed_tensors(c);
  if (source.empty()) throw error(errc::unsupported, "no state dict found in the checkpoint").with_file(c.path);
  std::vector<keyed_tensor> target;
  std::map<std::string, size_t> constant_of_fqn;
  for (size_t i = 0; i < m.constants.size(); ++i) {
    const constant& k = m.constants[i];
    if (k.original_fqn.empty()) continue;
    if (!constant_of_fqn.emplace(k.original_fqn, i).second)
      throw error(errc::unsupported, "model '" + m.name + "': two constants come from '" + k.original_fqn + "'");
    target.push_back({k.original_fqn, k.type.value_or(dtype::bits8), k.shape});
  }
  match_result r = match_keys(source, target);
  const std::string context = "cannot swap the checkpoint into model '" + m.name + "': ";
  if (!r.ambiguity.empty()) throw error(errc::check_failed, context + "ambiguous key alignment, refusing: " + r.ambiguity);

  if (!r.unexpected.empty()) {
    std::map<std::string, const keyed_tensor*> by_key;
    for (const auto& s : source) by_key[s.key] = &s;
    std::vector<std::string> literal, unknown;
    for (const auto& k : r.unexpected) (inlinable(by_key.at(k)->shape) ? literal : unknown).push_back(k);
    std::string why;
    if (!literal.empty())
      why += std::to_string(literal.size()) + " keys were compiled into the package as literals (" + first_few(literal) +
             "; Inductor inlines 0-d tensors and 1-D tensors of at most 8 elements: recompile with "
             "always_keep_tensor_constants=True to make them swappable)";
    if (!unknown.empty())
      why += std::string(why.empty() ? "" : "; ") + std::to_string(unknown.size()) +
             " keys name no constant of the package (" + first_few(unknown) + ")";
    throw error(errc::unsupported, context + why + "; convert --select can drop keys you do not mean to swap");
  }
  if (!r.shape_mismatches.empty())
    throw error(errc::unsupported, context + "shapes differ from the package's constants: " + first_few(r.shape_mismatches));
  if (!r.dtype_mismatches.empty())
    throw error(errc::unsupported, context + "dtypes differ from the package's constants (no conversion is made): " +
                                       first_few(r.dtype_mismatches));

  swap_plan plan;
  plan.key_edit = r.edit;
  std::set<size_t> covered;
  for (const auto& [src, dst] : r.mapping) {
    const size_t i = constant_of_fqn.at(dst);
    const constant& k = m.constants[i];
    const std::string at = context + "constant " + k.name + " ('" + k.original_fqn + "') ";
    if (!k.type) throw error(errc::unsupported, at + "has dtype " + k.dtype_text + ", unknown to ckptool");
    if (k.from_folded || k.kind == constant_kind::folded_constant)
      throw error(errc::unsupported, at + "is folded from other constants at load time, not a weight to replace");
    if (!k.strided) throw error(errc::unsupported, at + "has an opaque (non-strided) layout");
    if (k.offset != 0)
      throw error(errc::unsupported, at + "is a view at storage offset " + std::to_string(k.offset) +
                                         " of a larger storage, which LibTorch's swap does not replace exactly");
    if (!k.device.empty() && k.device != m.device)
      throw error(errc::unsupported, at + "lives on " + k.device + ", the model on " + m.device);
    auto extent = constant_extent(k);
    if (!extent || *extent > k.data_size)
      throw error(errc::corrupt, at + "does not fit its " + std::to_string(k.data_size) + "-byte slot");
    plan.pairs.push_back({src, i});
    covered.insert(i);
  }
  for (size_t i = 0; i < m.constants.size(); ++i) {
    const constant& k = m.constants[i];
    if (covered.count(i) || k.original_fqn.empty() || k.from_folded) continue;
    plan.missing.push_back(k.original_fqn);
  }
  if (!plan.missing.empty()) {
    if (m.weights == weights_place::none || m.weights == weights_place::pickle_files)
      throw error(errc::unsupported, context + "the package holds no weights of its own, and the checkpoint lacks " +
                                         first_few(plan.missing) + " (running it would read uninitialized constants)");
    if (strict)
      throw error(errc::check_failed, context + std::to_string(plan.missing.size()) +
                                          " package constants are missing from the checkpoint: " + first_few(plan.missing) +
                                          "; --no-strict keeps the package's own values for them");
    plan.kept = plan.missing;
  }
  return plan;
}

}  // namespace ckpt::aoti
