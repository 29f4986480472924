// Writes a value tree (ckpt/pickle.h) back as a pickle, byte for byte the way CPython's
// pickle.dumps(obj, protocol=2) writes the equivalent Python objects: the protocol
// torch.save uses, readable by every PyTorch and by torch.load(weights_only=True) when the
// globals are allow-listed.
//
// Sharing is kept: a node reached twice is written once and fetched from the memo
// (BINPUT/BINGET), so tied weights stay tied and cycles terminate, as in CPython.
// Where protocol 2 has no spelling for a node, the writer uses the nearest opcode that
// every CPython unpickler accepts: NEWOBJ_EX for keyword __new__ calls (protocol 4) and
// OBJ for INST/OBJ records (protocol 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ckpt/pickle.h"

namespace ckpt::pickle {

/// Throws ckpt::error: `unsupported` for a protocol other than 2 or a value protocol 2
/// cannot carry (a non-ASCII global name, a string of 4 GiB or more), `limit` for nesting
/// deeper than the writer recurses (10,000 levels).
/// `owner`, the document the tree's nodes come from, lets the writer keep its per-node
/// bookkeeping in arrays indexed by node id (much faster and smaller for big trees); nodes
/// it does not own are handled all the same, only more slowly. The bytes do not depend on it.
/// `expected_size`, when known, is reserved up front (the result is grown past it if need be).
std::vector<uint8_t> write(const value* root, int protocol = 2, const document* owner = nullptr,
                           size_t expected_size = 0);

/// Receives a pickle's bytes in order, in pieces of about a megabyte.
using byte_sink = std::function<void(const uint8_t* data, size_t size)>;

/// The same bytes as write(), handed to `sink` piece by piece instead of held whole: a
/// caller that writes them out (rekey, for a million tensors a pickle of 100 MB) never holds
/// them beside the tree. Returns the number of bytes. An exception the sink throws stops the
/// writing and is rethrown.
uint64_t write_to(const byte_sink& sink, const value* root, int protocol = 2, const document* owner = nullptr);

}  // namespace ckpt::pickle
