// Wrapper segments: the key parts that training wrappers add to state-dict keys.
//   torch.compile        OptimizedModule     "_orig_mod."   anywhere (a compiled submodule)
//   DDP / DataParallel   .module             "module."      leading, or right after a wrapper
//   FSDP (v1)            FlatParamsWrapper   "_fsdp_wrapped_module."       anywhere
//   activation ckpt      CheckpointWrapper   "_checkpoint_wrapped_module." anywhere
//   Lightning Fabric     _FabricModule       "_forward_module."            anywhere
//   LightningModule      self.model          "model."       leading only (often a real name)
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt {

/// Splits a state-dict key on '.' into module path segments.
std::vector<std::string_view> split_key(std::string_view key);

/// Whether segment `i` of `segments` is a wrapper segment under the rules above.
bool is_wrapper_segment(const std::vector<std::string_view>& segments, size_t i);

/// For each wrapper segment ("_orig_mod.", ...), how many keys contain it. Zero counts are
/// left out, and so is a leading "model." (ambiguous: see count_wrappers).
std::map<std::string, size_t> count_wrappers(const std::vector<std::string>& keys);

}  // namespace ckpt
