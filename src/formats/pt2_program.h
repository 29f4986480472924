// Internal: the JSON readers of a torch.export archive (formats.md §14.3-14.4): a payload
// config (data/weights/<m>_weights_config.json, data/constants/<m>_constants_config.json)
// and a program (models/<m>.json). Pure functions over text, so the fuzz target and the
// archive reader run the same code. Union tags are checked here: nlohmann, like the
// schema's generated C++ types, would accept any.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/pt2.h"
#include "formats/pt2_schema.h"

namespace ckpt::detail {

/// One entry of a PayloadConfig, in the file's order.
struct payload_entry {
  std::string fqn;
  std::string path_name;            // "weight_0", "tensor_1", "custom_obj_0": a plain file name
  bool is_param = false;
  bool use_pickle = false;
  std::optional<pt2s::tensor_meta> meta;  // null for script objects
};

/// Parses a PayloadConfig ({"config": {fqn: PayloadMeta}}). Throws errc::corrupt naming
/// `w.record` and the entry: an unknown dtype or layout, a path_name that is not a plain
/// file name, a tensor entry without tensor_meta, ...
std::vector<payload_entry> parse_payload_config(std::string_view text, const pt2s::where& w);

/// Parses an ExportedProgram. Throws errc::corrupt naming `w.record` and what is wrong (an
/// unknown union tag, a missing member, an unknown dtype). Without `with_graph` the graph's
/// nodes and its values' metadata (tensor_values) are checked as JSON only, never built or
/// read (program::nodes stays empty, no signature value has_meta, program::graph_read
/// false): loading weights needs the signature's names alone.
pt2::program parse_program(std::string_view text, const pt2s::where& w, bool with_graph = true);

/// Renders a pytree TreeSpec JSON string (module_call_graph's in_spec/out_spec) with its
/// leaves named by `leaves` in order ("*" past the end): "((idx, x), {})",
/// "(add_1, {'logits': add_2})". nullopt when it is not a TreeSpec this understands.
std::optional<std::string> render_treespec(std::string_view spec, const std::vector<std::string>& leaves);

}  // namespace ckpt::detail
