// Internal: the torch.export part of inspect's JSON ("pt2", docs/inspect-json.md) and of
// verify (the configs against the program's signature, formats.md §14.6).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"

namespace ckpt {

/// inspect --json's "pt2" member; the graph's nodes only with `graph`.
nlohmann::json pt2_inspect_json(const checkpoint& c, bool graph);

struct pt2_check {
  std::vector<std::string> problems;  // what torch.export.load would refuse or get wrong
  std::vector<std::string> notes;     // what was not checked, and why
};
/// Every parameter and buffer the signature names against the weights config (persistent
/// buffers) or the constants config (non-persistent buffers, tensor constants, script
/// objects), with dtype and shape; every config entry the signature does not name; the
/// sample inputs torch.export.load reads; the parts left to others (AOTInductor models).
pt2_check check_pt2(const checkpoint& c);

}  // namespace ckpt
