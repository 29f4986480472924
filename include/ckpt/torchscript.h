// TorchScript archives (torch.jit.save) built by LibTorch on the meta device, so their
// structure, parameter shapes and method schemas can be shown, and their methods run on
// shapes alone, without reading the tensor data (formats.md §5).
//
// torch::jit::load(path, kMeta) reads every storage record before moving it to meta
// (findings.md); here LibTorch reads through an adapter that answers reads inside the
// data/ and constants/ records without touching the file, so opening a multi-GB module
// costs a few kilobytes of I/O and no resident memory for the weights.
//
// Plain structs only: the CLI formats these without including LibTorch headers. The
// implementation lives in src/torch/torchscript.cpp (library ckpt_torch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/zip_reader.h"

namespace ckpt {

struct ts_tensor {
  std::string name;            // full dotted name, "encoder.0.weight"
  std::string dtype;           // PyTorch's name without "torch.": "float32", "int64", ...
  std::vector<int64_t> shape;
  std::string tied_to;         // the first name of the same tensor object, when another
                               // name listed before it is that tensor too (tied weights)
};

struct ts_submodule {
  std::string name;            // dotted attribute path from the root, "encoder.0"
  std::string type;            // qualified class name, "__torch__.torch.nn.modules.linear.Linear"
};

struct ts_method {
  std::string name;            // "forward", "evaluation_step", ...
  std::string schema;          // as LibTorch prints it: "forward(__torch__.Net self, Tensor x) -> Tensor"
};

/// An attribute that is neither a submodule, a parameter/buffer nor a tensor ("training"
/// and the hook bookkeeping slot excluded), or a class constant (`__constants__` / Final,
/// e.g. BatchNorm's eps, Conv's stride).
struct ts_attribute {
  std::string name;            // dotted path, "head.num_classes"
  std::string type;            // TorchScript annotation, "int", "List[str]", "Optional[float]"
  std::string value;           // short rendering of simple values ("3", "True", "'relu'",
                               // "[1, 2]", "None"); empty when not simple or too long
  bool constant = false;       // a class constant rather than a per-object attribute
};

struct torchscript_info {
  std::string type;                       // root class, "__torch__.Net"
  bool training = false;                  // the root's training flag as saved
  std::vector<ts_submodule> submodules;   // every descendant module, depth first
  std::vector<ts_tensor> parameters;      // named_parameters(), registration order
  std::vector<ts_tensor> buffers;         // named_buffers()
  std::vector<ts_method> methods;         // the root class's compiled methods
  std::vector<ts_method> submodule_methods;  // every submodule's, named by path:
                                             // "blocks.0.attn.forward"
  std::vector<ts_attribute> attributes;   // of the root and all submodules, constants after
                                          // the attributes of each module
  uint64_t bytes_read = 0;                // bytes the loader actually read from the file
  uint64_t bytes_skipped = 0;             // bytes it asked for inside tensor records
};

/// Builds the module on meta and describes it. Throws ckpt::error naming `path`:
/// unsupported for legacy (model.json) or non-TorchScript archives and for anything this
/// LibTorch cannot load; corrupt when LibTorch rejects the archive's structure.
/// `ar` is the already opened index of the same file; LibTorch reads through ar.source().
/// Unsafe, before LibTorch sees the file, when loading would run the file's own code
/// (__setstate__, evaluated defaults: ckpt/torchscript_code.h), unless `allow_code`.
torchscript_info inspect_torchscript(const std::string& path, const zip::archive& ar, bool allow_code = false);

struct input_spec {
  std::vector<int64_t> shape;
  dtype type = dtype::float32;
};

/// A non-tensor argument of a method, from the command line: "16000" (positional, after
/// the tensor inputs) or "sr=16000" (by name). Its text is read as the type the method's
/// schema declares: int, float, bool, str, None (for an Optional), a list of ints
/// ("1,2,3" or "[1, 2, 3]").
struct arg_spec {
  std::string name;            // empty: positional
  std::string text;
};

/// One leaf of a method's result. Tuples, lists and dicts are flattened into paths.
struct meta_output {
  std::string path;            // "" for a single result; "0", "1.2", "logits" for nested ones
  bool is_tensor = false;
  std::string type;            // "Tensor", or the TorchScript type of a non-tensor leaf
  std::string dtype;           // tensors only
  std::vector<int64_t> shape;  // tensors only
  std::string value;           // non-tensors: short rendering when simple ("None", "3")
};

/// Loads on meta, calls `method` with meta tensors of the given shapes and dtypes, and
/// reports what it returns. The module runs in the mode it was saved in (its training
/// flag), without autograd. `method` may also name a TorchScript overload set
/// ("forward" of a scripted nn.LSTM is stored as forward__0/forward__1): the first
/// overload that takes the given tensors is used. Operators whose meta kernels exist only
/// in Python are supplied by src/torch/meta_kernels.cpp (convolution, batch norm,
/// index_select, where, relu, ...). Throws ckpt::error: usage when the method does not
/// exist or rejects the inputs (wrong count, mismatched shapes); unsupported when an
/// operator still has no meta kernel or needs tensor values (data-dependent control
/// flow, .item(), nonzero).
std::vector<meta_output> run_on_meta(const std::string& path, const zip::archive& ar,
                                     const std::string& method,
                                     const std::vector<input_spec>& inputs, bool allow_code = false,
                                     const std::vector<arg_spec>& args = {});

}  // namespace ckpt
