// Binding a method's arguments from the command line: tensors (--input) first, in order,
// then the non-tensor values (--arg) positionally or by name, checked against the schema.
#pragma once

#include <string>
#include <vector>

#include <torch/script.h>

#include "ckpt/torchscript.h"

namespace ckpt::detail {

/// The full argument list (self excluded) for a call of `schema` with `tensors` and `args`;
/// the defaults fill what neither gives. Throws errc::usage naming `method` and the
/// argument for a wrong type, an unknown or repeated name, too many or missing arguments.
std::vector<c10::IValue> bind_arguments(const c10::FunctionSchema& schema, const std::string& method,
                                        std::vector<c10::IValue> tensors, const std::vector<arg_spec>& args);

/// A method of `m` or of one of its submodules ("blocks.0.attn.forward") ready to call.
struct bound_call {
  torch::jit::Method method;
  std::vector<c10::IValue> args;
};

/// `name` itself, or else the first of its TorchScript overloads ("forward__0",
/// "forward__1": @torch.jit._overload_method, as in nn.LSTM) that binds `tensors` and
/// `args`. Throws errc::usage when there is no such method or none binds them (the first
/// overload's reason).
bound_call bind_call(const torch::jit::Module& m, const std::string& name, const std::vector<c10::IValue>& tensors,
                     const std::vector<arg_spec>& args);

}  // namespace ckpt::detail
