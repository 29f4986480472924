// How the names of pickled globals are rewritten between Python 2 and 3 (CPython's
// _compat_pickle) and across PyTorch module moves.
#pragma once

#include <string>

namespace ckpt::pickle::detail {

/// Unpickler side, fix_imports=True: ("__builtin__", "unicode") -> ("builtins", "str").
void python2_to_3(std::string* module, std::string* name);
/// Pickler side, protocol < 3: ("builtins", "set") -> ("__builtin__", "set").
void python3_to_2(std::string* module, std::string* name);

}  // namespace ckpt::pickle::detail
