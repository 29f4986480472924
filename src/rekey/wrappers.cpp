#include "ckpt/wrappers.h"

#include <set>

namespace ckpt {
namespace {

bool is_anywhere_wrapper(std::string_view s) {
  return s == "_orig_mod" || s == "_fsdp_wrapped_module" || s == "_checkpoint_wrapped_module" ||
         s == "_forward_module";
}

}  // namespace

std::vector<std::string_view> split_key(std::string_view key) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t dot = key.find('.', start);
    out.push_back(key.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

bool is_wrapper_segment(const std::vector<std::string_view>& segments, size_t i) {
  // The last segment is the tensor's own name (a parameter called "module" is not a wrapper).
  if (i + 1 >= segments.size()) return false;
  std::string_view s = segments[i];
  if (is_anywhere_wrapper(s)) return true;
  if (s == "module") {
    if (i == 0) return true;
    for (size_t j = 0; j < i; ++j)
      if (!is_wrapper_segment(segments, j)) return false;
    return true;  // only wrappers before it: DDP around a compiled or FSDP module
  }
  if (s == "model") return i == 0;
  return false;
}

std::map<std::string, size_t> count_wrappers(const std::vector<std::string>& keys) {
  std::map<std::string, size_t> counts;
  for (const auto& key : keys) {
    // Every counted segment contains one of these; most keys of a large model hold neither,
    // and splitting them all cost more than the rest of the report.
    if (key.find("module") == std::string::npos && key.find("_orig_mod") == std::string::npos) continue;
    auto segments = split_key(key);
    std::set<std::string_view> seen;
    // A leading "model." is counted nowhere: it is as often the model's own attribute name
    // (Hugging Face's LlamaForCausalLM.model) as a LightningModule's.
    for (size_t i = 0; i < segments.size(); ++i)
      if (is_wrapper_segment(segments, i) && segments[i] != "model") seen.insert(segments[i]);
    for (auto s : seen) counts[std::string(s) + "."]++;
  }
  return counts;
}

}  // namespace ckpt
