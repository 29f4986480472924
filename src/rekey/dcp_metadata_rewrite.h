// The `.metadata` half of a DCP rekey (docs/formats.md §9.7): the pickle is decoded twice,
// once into the checked struct (decode_metadata) and once into the value tree, and only the
// tree is edited and written back, so fields and forms the struct does not model are kept
// as they were.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/dcp_rekey.h"

namespace ckpt::dcp {

struct metadata_rewrite {
  metadata before;            // the input, decoded and checked
  std::vector<uint8_t> bytes; // the new .metadata; empty for a dry run
  dcp_rekey_result result;    // plan, counts, byte_items, unknown_fields
};

/// Renames the keys of the `.metadata` bytes given. Errors carry offsets in those bytes;
/// the caller names the file. A plan that renames nothing gives the input bytes unchanged.
/// `rank_local`: one rank's `__N.metadata` (docs/formats.md §9.8), whose boxes cover their
/// tensors only together with the other ranks': the coverage check is left to the caller.
metadata_rewrite rewrite_metadata(const uint8_t* data, size_t size, const std::vector<key_op>& ops,
                                  const pickle::limits& lim, bool dry_run, bool rank_local = false);

}  // namespace ckpt::dcp
