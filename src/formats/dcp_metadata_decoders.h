// Internal: the two decoders of a DCP `.metadata` pickle (docs/formats.md §9.2, §9.11).
// dcp::decode_metadata runs the one-pass decoder and, when it declines, the tree decoder,
// which is the reference: it decides every file the one-pass decoder does not take, with
// its errors. Tests and the dcp_metadata fuzz target run both and compare.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ckpt/dcp.h"

namespace ckpt::dcp::detail {

/// pickle::parse into a value tree, then a walk over it. Throws as decode_metadata does.
metadata decode_metadata_tree(const uint8_t* data, size_t size, const decode_options& options);

/// One pass over the opcodes into compact records, then the entries (§9.11). Never throws
/// for the input's sake: returns false for anything outside the form PyTorch's pickler
/// writes (any error, limit, unknown global or field, unusual opcode), leaving `out` in an
/// unspecified state; true means decode_metadata_tree gives exactly `*out` for these bytes.
bool decode_metadata_stream(const uint8_t* data, size_t size, const decode_options& options, metadata* out);

}  // namespace ckpt::dcp::detail
