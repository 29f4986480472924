// Internal: the tensors of a TorchScript module that no state dict holds, filled from the
// model file itself (materialize --model).
//
// load_on_meta leaves every tensor of the module on meta. load_module fills the parameters
// and buffers from the checkpoint; these are the rest, which torch.jit.load gives with the
// values the model file stores:
//  - plain tensor attributes (`self.x = torch.tensor(...)`, neither parameter nor buffer),
//    of modules and of script-class objects, also inside lists, dicts and tuples;
//  - the archive's tensor constants (CONSTANTS.cN in the code): the constant nodes of every
//    graph and the tensor defaults of every method's schema.
// Each is read from its own data/ or constants/ record of the model file onto the device,
// keeping its dtype (--dtype casts parameters and buffers only, as Module.to(dtype) does).
// An attribute that shares a model-file storage with a parameter or buffer becomes a view
// of the filled parameter, as it would see the checkpoint's values after load_state_dict.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include <torch/script.h>

#include "ckpt/checkpoint.h"
#include "ckpt/load.h"

namespace ckpt::detail {

struct model_file_fill {
  std::vector<std::string> names;  // "blocks.0.scale", "lut[1]", "CONSTANTS.c0", in order found
};

/// Replaces every such tensor of `m` with its value from `model_file` (the archive `m` was
/// loaded from) on options.device. `filled` maps each parameter's and buffer's meta tensor
/// (TensorImpl) to its filled value; `filled_by_name` maps their names to the same values.
/// Throws errc::unsupported naming the tensor when one cannot be found in the model file
/// exactly, and, off meta, when any tensor reachable from `m` is still on meta afterwards.
model_file_fill fill_from_model_file(torch::jit::Module& m, const checkpoint& model_file,
                                     const std::unordered_map<const void*, at::Tensor>& filled,
                                     const std::unordered_map<std::string, at::Tensor>& filled_by_name,
                                     const load_options& options);

/// The meta tensors still reachable from `m` (attributes, graph constants, schema
/// defaults), by name; at most `limit` of them.
std::vector<std::string> meta_tensors_left(const torch::jit::Module& m, size_t limit);

}  // namespace ckpt::detail
