// Where a renamed DCP key's planner_data path goes (docs/formats.md §9.7). flatten_state_dict
// keys every leaf by its nesting path joined with dots, so a rename of the dotted key must be
// carried back into the path's elements, and that is exact only when the edit stays inside
// one mapping key or removes one whole level.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ckpt/dcp.h"

namespace ckpt::dcp {

/// ".".join(map(str, path)), as flatten_state_dict builds a key from its path.
std::string join_path(const std::vector<path_element>& path);

/// "('model', 0, 'w')": a path as Python prints the tuple, for messages.
std::string repr_path(const std::vector<path_element>& path);

/// The path `new_key` takes when `old_key` (spelled by `path`) is renamed: every element
/// kept but one mapping key whose text changes, or every element kept but one mapping key
/// removed. When no such path spells `new_key`, or when two different ones do, returns
/// nothing and sets `why`.
std::optional<std::vector<path_element>> rename_path(const std::vector<path_element>& path,
                                                     const std::string& new_key, std::string* why);

}  // namespace ckpt::dcp
