// The human-readable form of `ckptool inspect`: summary, tensor table, totals, entries,
// warnings. The JSON form is ckpt::write_inspect_json plus the TorchScript part.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/torchscript.h"

namespace cli {

struct text_options {
  std::string filter;  // glob over keys; empty = all
  bool tree = false;   // module tree instead of the flat table
  bool chunks = false;  // a set's keys with the pieces they are assembled from
  bool graph = false;   // torch.export archives: every node of each program
};

/// Whether `key` passes the --filter glob (shell-style, '*' also matches '.').
bool key_matches(const std::string& glob, const std::string& key);

void print_inspect_text(std::ostream& out, const ckpt::checkpoint& c, const ckpt::torchscript_info* ts,
                        const text_options& options);

/// The text form for a checkpoint of several files (inspect_set_text.cpp); called by
/// print_inspect_text for a DCP directory: keys with global shapes and their chunks (a shard
/// set is printed as one file is, with its layout and files table).
void print_set_text(std::ostream& out, const ckpt::checkpoint& c, const text_options& options);

/// The torch.export part (inspect_pt2_text.cpp): versions, signature, symbolic dims, graph.
void print_pt2_text(std::ostream& out, const ckpt::checkpoint& c, const text_options& options);

void print_meta_outputs(std::ostream& out, const std::string& method,
                        const std::vector<ckpt::meta_output>& outputs);

}  // namespace cli
