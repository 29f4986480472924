// AOTInductor packages (torch._inductor.aoti_compile_and_package): what a package holds,
// read from its zip directory, its JSON metadata and the generated wrapper.cpp, without
// loading the compiled model (docs/formats.md §15). Nothing here runs the package's code.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dtype.h"
#include "ckpt/zip_reader.h"

namespace ckpt::aoti {

/// torch::aot_inductor::ConstantType (formats.md §15.3).
enum class constant_kind { unknown = 0, parameter = 1, buffer = 2, tensor_constant = 3, folded_constant = 4 };
const char* kind_name(constant_kind k);

/// One row of the wrapper's constants table, in table order (the order of the weights in
/// the .so's data and in a binary blob).
struct constant {
  std::string name;          // the model's internal name ("fc1_weight")
  std::string original_fqn;  // the state-dict key it came from ("fc1.weight"); may be empty
  std::string dtype_text;    // as written ("float32"); `type` when ckptool knows it
  std::optional<dtype> type;
  std::string device;        // "cpu", "cuda", ... ("" when the table does not say)
  int64_t offset = 0;        // storage offset, in elements
  uint64_t data_size = 0;    // bytes reserved (its storage, padded to 64 for CPU models)
  bool from_folded = false;
  constant_kind kind = constant_kind::unknown;
  std::vector<int64_t> shape, stride;
  bool strided = true;       // layout strided (mkldnn constants are opaque)
  uint64_t line = 0;         // wrapper.cpp line of its first field
};

/// What the generated check_input_<i>() verifies of input i (run only when
/// AOTI_RUNTIME_CHECK_INPUTS=1 is set, formats.md §15.4).
struct input_dim {
  int64_t dim = 0;
  std::optional<int64_t> size;      // a static size
  std::optional<int64_t> min, max;  // a dynamic size's bounds
  std::string symbol;               // "s77", from run_impl
};
struct input_check {
  size_t index = 0;
  std::string name;                 // inputs_info_[i].name
  std::string dtype_text;           // "" when no check was generated
  std::vector<input_dim> dims;      // by dim; only the dims the checks name
  std::vector<std::optional<int64_t>> strides;
  std::string device;               // "" unknown
};

enum class weights_place { in_so, blob, pickle_files, none };
const char* place_name(weights_place p);

struct package_file {
  std::string record;  // relative to the archive's folder: data/aotinductor/model/x.wrapper.so
  uint64_t size = 0;
  std::string role;    // "wrapper source", "model library", "weights blob", ...
};

struct model {
  std::string name;                            // the folder under data/aotinductor/
  std::vector<package_file> files;
  std::map<std::string, std::string> metadata; // wrapper_metadata.json
  std::string device;                          // AOTI_DEVICE_KEY
  std::vector<std::string> isa_missing;        // AOTI_CPU_ISA features this CPU lacks
  std::string wrapper_record, library_record, blob_record, weights_config_record;
  size_t num_inputs = 0, num_outputs = 0;
  bool include_weights = true;                 // the constructor's last argument
  weights_place weights = weights_place::none;
  std::vector<constant> constants;
  std::vector<std::string> output_names;
  std::string in_spec, out_spec;               // pytree JSON, as written
  std::vector<input_check> inputs;
  std::vector<std::string> warnings;
};

struct package {
  std::string root;             // the archive's top-level folder
  std::string archive_version;  // "0"
  std::vector<model> models;
};

/// An archive whose archive_format record is "pt2" and that holds data/aotinductor/<m>/
/// but no models/*.json (an ExportedProgram that also carries AOTI files is the
/// ExportedProgram reader's).
bool is_aoti_package(const zip::archive& ar);

/// Reads every model of the package from metadata alone. Throws ckpt::error: corrupt (a
/// record contradicting itself or the format, with a file offset where there is one),
/// unsupported (a newer archive_version, what the reader cannot read exactly), limit.
package read_package(const zip::archive& ar);

/// The constants table parsed out of a wrapper.cpp's text (exposed for tests and fuzzing).
/// `base` is the text's offset in its file, for error offsets (nullopt when deflated).
void parse_wrapper(std::string_view text, model& m, std::optional<uint64_t> base);

/// verify: problems found (empty: consistent). Checks the constants table against the
/// blob's size or the weights the library's symbol table delimits, every constant's byte
/// extent against its reserved size, and the records' presence; reads no weight bytes.
/// `notes` (optional) receives what could not be checked.
std::vector<std::string> check_package(const zip::archive& ar, const package& p,
                                       std::vector<std::string>* notes = nullptr);

/// Which state-dict keys of `c` go into which constants of `m`, solved as materialize
/// --model solves TorchScript (wrapper segments such as `_orig_mod.`).
struct swap_pair {
  std::string key;       // the checkpoint's key
  size_t constant = 0;   // index into m.constants
};
struct swap_plan {
  std::string key_edit;
  std::vector<swap_pair> pairs;
  std::vector<std::string> kept;     // constants not in the checkpoint, keeping the package's value
  std::vector<std::string> missing;  // the same, refused when strict
};
/// Validates every pair before any LibTorch call (update_constant_buffer checks nothing,
/// formats.md §15.5): throws errc::unsupported for a key the package cannot take (compiled
/// in as a literal, or no such constant), a dtype or shape that differs, a constant that
/// cannot be replaced exactly (folded, opaque layout, storage offset, another device);
/// errc::check_failed for constants the checkpoint lacks when `strict`.
swap_plan plan_swap(const checkpoint& c, const model& m, bool strict);

/// The model named `name` ("" picks the only one; several models need a name).
const model& pick_model(const package& p, const std::string& name);

}  // namespace ckpt::aoti
