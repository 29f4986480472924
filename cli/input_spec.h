// "--input 4x5:int64": a tensor shape and dtype given on the command line.
#pragma once

#include <string>

#include "ckpt/torchscript.h"

namespace cli {

/// "4x5:int64", "3x224x224" (float32), "():float64" for a 0-d tensor. Throws errc::usage.
ckpt::input_spec parse_input_spec(const std::string& spec);

/// "--arg 16000" (positional, after the --input tensors) or "--arg sr=16000" (by name: an
/// identifier before the first '='). Its type is checked against the method's schema later.
ckpt::arg_spec parse_arg_spec(const std::string& spec);

}  // namespace cli
