// Code that a TorchScript archive makes LibTorch run while it is being loaded, found by
// reading the archive's code/ records ourselves, before LibTorch sees the file.
//
// torch::jit::load (any device, meta included) runs two kinds of the file's own code:
//  - a class's __setstate__, for every object of that class in data.pkl or constants.pkl
//    (torch/csrc/jit/serialization/import.cpp: the unpickler's object loader calls it);
//  - default values of parameters and class-level assignments (NamedTuple field defaults,
//    Final constants): the compiler evaluates each such expression by compiling it into a
//    function and running it (ir_emitter.cpp, evaluateDefaults), so a default such as
//    `n: int=__torch__.f()` calls f at load time.
// TorchScript's printer writes defaults and class constants as literals (numbers,
// strings, None/True/False, inf, nan, torch.device("cpu"), tuples and lists of them, and
// CONSTANTS.cN for a tensor, which names an entry of constants.pkl), so anything else
// there is refused. Built-in operators on constants that the compiler
// folds are not the file's code; their cost is bounded by the caller's load timeout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/zip_reader.h"

namespace ckpt {

struct load_time_code {
  std::string record;               // "code/__torch__.py"
  std::string owner;                // qualified class, "__torch__.Net"; or the function
  std::string what;                 // "class __torch__.Net defines __setstate__, ...",
                                    // "__torch__.Net.forward: the default of parameter 'n' ..."
  std::optional<uint64_t> offset;   // file offset, when the record is stored uncompressed
};

/// Every construct in the archive's code/ records that LibTorch would run on load.
std::vector<load_time_code> find_load_time_code(const zip::archive& ar);

/// A parameter default that is a tensor of the archive's constant table: TorchScript's
/// printer writes `def forward(self, x: Tensor, k: Tensor=CONSTANTS.c1)`.
struct constant_default {
  std::string function;   // qualified, as LibTorch names it: "__torch__.Net.forward"
  std::string parameter;  // "k"
  size_t constant = 0;    // 1: the second entry of constants.pkl
};

/// Every such default in the archive's code/ records.
std::vector<constant_default> find_constant_defaults(const zip::archive& ar);

/// what, then the record: "class __torch__.Net defines __setstate__, ... (code/__torch__.py)".
std::string describe(const load_time_code& c);

/// Throws errc::unsafe naming the first finding (and how many there are) unless there is
/// none. `flag` names the option that allows loading anyway ("--allow-code").
void refuse_load_time_code(const zip::archive& ar, const std::string& flag = "--allow-code");

}  // namespace ckpt
