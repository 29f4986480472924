// Internal: a pickled nn.Module (torch.save(model), either format) read as the state dict
// its state_dict() would give, found through the module tree's _parameters, _buffers,
// _non_persistent_buffers_set and _modules, without running any of its classes' code.
#pragma once

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

/// When the root of `doc` (c's pickle), or one of its top-level entries, is a pickled
/// nn.Module, sets c.module_class, c.keys, c.state_dict (its path) and c.state_dict_node (its node),
/// or, when its keys cannot be known from the file, c.module_class and c.module_unread.
/// For files where find_state_dict found no state dict.
void find_pickled_module(checkpoint& c, const pickle::document* doc, const open_options& options);

}  // namespace ckpt::detail
