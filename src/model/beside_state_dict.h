// The tensors a pickle holds beside a state dict below its root: {'w': t1, 'opt': {...}},
// whose state dict is 'opt' (ckptool-inspect(1) says how one is found), leaves 'w' out of the keys and, being a
// tensor, out of the entries too. Every verb that walks keys and entries must take them
// as well, or a change in one passes unseen (diff) or it is left out unsaid (convert).
#pragma once

#include <cstddef>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

/// Indices into c.tensors of the records no key names (nor an assembled key's pieces),
/// that lie outside the state dict and inside no entry; empty when the state dict is the
/// root (or there is none), where every value is a key or an entry.
std::vector<size_t> tensors_beside_state_dict(const checkpoint& c);

}  // namespace ckpt::detail
