// Loading a checkpoint's tensors onto a device for C++ services that embed LibTorch:
// every storage is read once from the file straight into its destination (parallel pread
// into at::empty on the CPU; a small ring of pinned buffers and asynchronous copies for
// CUDA), one allocation per storage, so views and tied weights stay views and tied.
// Nothing is ever randomly initialized.
//
//   #include <ckpt/load.h>
//   auto tensors = ckpt::load_tensors("model.pt", {c10::Device("cuda:0")});
//   torch::jit::Module m = ckpt::load_module("scripted.pt", "last.ckpt", {c10::Device("cuda:0")});
//
// Link ckpt_torch and LibTorch. Errors are ckpt::error (ckpt/error.h).
#pragma once

#include <torch/script.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt {

class output_file;  // ckpt/output_set.h

struct load_options {
  c10::Device device = c10::Device(c10::kCPU);
  /// Cast floating-point tensors to this type on the device, after the copy.
  std::optional<c10::ScalarType> dtype;
  /// CPU only: tensors backed by a private (copy-on-write) mapping of the file, as
  /// torch.load(mmap=True) does; nothing is read until touched.
  bool mmap = false;
  /// With mmap: map every page of the tensors' bytes before returning (reading the ones not
  /// in the page cache), so no later access takes a page fault. Still zero-copy: the pages
  /// are the page cache's own until a tensor is written.
  bool populate = false;
  /// Reader threads (0: a sensible default for the machine).
  int threads = 0;
  /// CUDA: pinned buffers in the ring and the size of each.
  int ring_slots = 4;
  uint64_t chunk_bytes = 64ull << 20;
  /// Called with (bytes done, bytes total) as data arrives; from reader threads.
  std::function<void(uint64_t, uint64_t)> progress;
  /// load_module: load a TorchScript model whose file holds code LibTorch runs on load
  /// (ckpt/torchscript_code.h); refused as errc::unsafe otherwise.
  bool allow_code = false;
  /// load_module: called once the model's skeleton is built on meta (the only part where
  /// the model file's code may run unasked), before any weight is read. A caller that
  /// bounds that part (a timer) ends the bound here.
  std::function<void()> model_built;
};

/// The tensors of `c` by name, in file order: state-dict keys for the tensors of the state
/// dict that was found, '/'-joined paths for the others (optimizer state, ...).
std::vector<std::pair<std::string, at::Tensor>> load_tensors(const checkpoint& c, const load_options& options);
/// The same, also listing each --dtype conversion ("name: float32 -> bfloat16").
std::vector<std::pair<std::string, at::Tensor>> load_tensors(const checkpoint& c, const load_options& options,
                                                          std::vector<std::string>* converted);
std::vector<std::pair<std::string, at::Tensor>> load_tensors(const std::string& path, const load_options& options);
/// As above, and frees c's decoded pickle (release_pickle) once the tensors are named,
/// before any storage is read: a million tensors then never hold their pickle tree and
/// their LibTorch tensors in memory at once.
std::vector<std::pair<std::string, at::Tensor>> load_tensors_releasing(checkpoint& c, const load_options& options,
                                                                       std::vector<std::string>* converted);

struct module_load_report {
  std::string key_edit;                        // the wrapper-segment edit applied
  std::vector<std::string> missing;            // model tensors the checkpoint lacks
  std::vector<std::string> unexpected;         // checkpoint tensors the model lacks
  std::vector<std::string> shape_mismatched;   // "name: checkpoint [..] vs model [..]"
  std::vector<std::string> dtype_converted;    // "name: float32 -> bfloat16"
  std::vector<std::string> filled_from_model;  // missing ones taken from the model file (non-strict)
  std::vector<std::string> from_model_file;    // tensors no state dict holds, always from the model
                                               // file: attributes ("blocks.0.scale", "lut[1]") and
                                               // the code's constants ("CONSTANTS.c0")
  uint64_t bytes = 0;                          // bytes read from the checkpoint
};

/// Builds the TorchScript model in `model_path` on the meta device (its weights are not
/// read), aligns `c`'s state dict to its parameters and buffers (wrapper segments such as
/// `_orig_mod.`, `module.`, a Lightning `model.` are solved for), and fills every one of
/// them, allocated empty on the device, from the checkpoint. Strict: a model tensor the
/// checkpoint lacks is errc::check_failed; non-strict: it is filled from the model file.
/// The module's other tensors (plain tensor attributes, tensor constants and defaults of
/// its code) are read from their own records of the model file onto the device, keeping
/// their dtype; no tensor of the result is left on meta (unless the device is meta).
torch::jit::Module load_module(const std::string& model_path, const checkpoint& c, const load_options& options,
                               bool strict = true, module_load_report* report = nullptr);
torch::jit::Module load_module(const std::string& model_path, const std::string& checkpoint_path,
                               const load_options& options, bool strict = true,
                               module_load_report* report = nullptr);

/// Writes tensors as a torch.save archive (what torch.load reads; tensors sharing a
/// storage keep sharing it) to `path`, atomically (ckpt/output_set.h).
void save_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& path);
/// The same into an open output of an output_set, which the caller commits.
void save_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors, output_file& out);

/// What torch.save records of a tensor besides its data and torch.load gives back: an
/// nn.Parameter comes back as one, requires_grad as saved, and the Python attributes set
/// on the tensor object (torch._utils._get_obj_state: a dict, or (dict, slots)).
struct tensor_state {
  bool parameter = false;
  bool requires_grad = false;
  const pickle::value* python_state = nullptr;  // in the checkpoint's pickle; null: none
};
/// The state of each tensor load_tensors(c, ...) returns, in the same order. Throws
/// errc::unsupported for Python attributes holding anything but plain values (None, bool,
/// numbers, str, bytes, and tuples, lists and dicts of them), which could not be written
/// back exactly.
std::vector<tensor_state> tensor_states(const checkpoint& c);
/// save_tensors writing each tensor with its state (states[i] for tensors[i]).
void save_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::vector<tensor_state>& states, output_file& out);

}  // namespace ckpt
