// torch.export archives (`.pt2`, formats.md §14): what an ExportedProgram archive says
// besides its tensors. The tensors themselves are ordinary storage and tensor records of the
// checkpoint (one storage per weight_<i> / tensor_<i> file, a view per entry of the weights
// and constants configs); this is the rest: versions, each model's program (signature,
// symbolic dimensions and their ranges, calling convention, graph), the entries ckptool
// lists but never reads (pickled tensor subclasses, script objects), and the parts it leaves
// to others (AOTInductor models, extra files).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt::pt2 {

/// One size, stride or offset: a number, or a symbolic expression (sympy's srepr in the
/// file, rendered here as "s77", "2*s77", "s17 - 1"; the raw text when it is not one of the
/// forms the renderer knows), with the example value the export traced it at (hint).
struct dim {
  std::optional<int64_t> value;
  std::string expr;                 // rendered; empty for a number
  std::string raw;                  // the srepr text as stored; empty for a number
  std::optional<int64_t> hint;
  bool rendered = true;             // false: expr is the raw text (the renderer gave up)
  /// "4", "s77", "2*s77".
  std::string text() const { return value ? std::to_string(*value) : expr; }
};

/// A value of the graph as the signature or a node's outputs name it.
struct value {
  std::string name;                 // "x", "add_1"; empty for an unnamed constant
  std::string kind;                 // "tensor", "sym_int", "sym_float", "sym_bool", "int", "float",
                                    // "bool", "string", "none", "custom_obj", "token", ... (the union tag
                                    // without "as_"; anything else as stored)
  std::string dtype;                // tensors with metadata: "float32"
  std::vector<dim> shape;           // tensors with metadata
  std::string device;               // tensors with metadata: "cpu", "cuda:0", "meta"
  std::string text;                 // a constant's or a symbolic int's value, rendered
  bool has_meta = false;            // tensors: found in the graph's tensor_values
};

/// An entry of the graph signature: what feeds each placeholder of the graph, or what each
/// output of the graph is.
struct signature_entry {
  std::string role;                 // inputs: "user_input", "parameter", "buffer", "tensor_constant",
                                    // "custom_obj", "token", "constant_input"; outputs: "user_output",
                                    // "loss_output", "buffer_mutation", "gradient_to_parameter",
                                    // "gradient_to_user_input", "user_input_mutation", "token",
                                    // "parameter_mutation"
  std::string target;               // the FQN a parameter/buffer/constant/mutation names; empty otherwise
  std::optional<bool> persistent;   // buffers
  value arg;
};

/// A symbol's range (range_constraints): min and max inclusive, nullopt for unbounded.
struct range {
  std::string symbol;
  std::optional<int64_t> min, max;
  /// "s77 ∈ [2, 1024]", "s77 ∈ [2, ∞]".
  std::string text() const;
};

struct node {
  std::string name;
  std::string target;               // "torch.ops.aten.linear.default"
  std::vector<value> outputs;
  std::string module;               // the innermost nn_module_stack entry's path ("fc"), "" for the root
  std::string module_type;          // its class ("torch.nn.modules.linear.Linear")
};

/// An entry of a payload config that ckptool lists but does not read.
struct opaque_entry {
  std::string fqn;
  std::string file;                 // "data/weights/weight_3" (relative to the archive root)
  std::string what;                 // "pickled tensor (use_pickle)", "script object"
  uint64_t nbytes = 0;
  bool weight = false;              // in the weights config (else the constants config)
};

struct program {
  std::string record;               // "models/model.json"
  std::optional<int64_t> schema_major, schema_minor;
  std::vector<std::pair<std::string, int64_t>> opset_version;  // [("aten", 10)]
  std::string torch_version;
  std::vector<std::string> verifiers;
  std::vector<std::string> guards;
  std::vector<signature_entry> inputs, outputs;
  std::vector<range> ranges;
  /// module_call_graph's root entry: the calling convention.
  std::vector<std::string> forward_arg_names;
  std::string in_spec, out_spec;    // pytree TreeSpec JSON, as stored
  std::string call;                 // rendered: "(idx, x) -> (add_1, {'logits': add_2})"; empty if unknown
  std::vector<std::string> submodules;  // the other module_call_graph entries' FQNs
  std::vector<node> nodes;
  /// False when the graph was not read (open_options::read_pt2_graph): `nodes` is empty
  /// whatever the graph holds, and no value of `inputs` or `outputs` has_meta.
  bool graph_read = true;
};

struct model {
  std::string name;                 // "model" for torch.export.save
  std::string key_prefix;           // "" for an archive of one model, else "<name>/"
  program prog;
  size_t weights = 0, constants = 0;  // tensor entries read from each config
  std::vector<opaque_entry> opaque;
  bool sample_inputs = false;       // data/sample_inputs/<name>.pt present
};

struct archive_info {
  std::string root;                 // the archive's top-level folder
  std::string archive_version;      // "0" (a missing record reads as "0")
  std::vector<model> models;
  std::vector<std::string> aoti_models;   // data/aotinductor/<name>/ folders
  std::vector<std::pair<std::string, uint64_t>> extra_files;  // extra/<name> and its size
  /// Records no part of ckptool's reading explains (not under data/, models/, extra/ and not
  /// one of the archive's small records).
  std::vector<std::string> other_records;
};

}  // namespace ckpt::pt2
