// "--input 4x5:int64": a tensor shape and dtype given on the command line.
#pragma once

#include <string>

#include "ckpt/torchscript.h"

namespace cli {

/// "4x5:int64", "3x224x224" (float32), "():float64" for a 0-d tensor. Throws errc::usage.
ckpt::input_spec parse_input_spec(const std::string& spec);

}  // namespace cli
