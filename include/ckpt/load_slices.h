// Loading one tensor-parallel rank's slices (docs/formats.md §16): load_tensors with a
// selection (ckpt/slice.h). Link ckpt_torch and LibTorch, as for ckpt/load.h.
//
//   auto sel = ckpt::slice_preset("llama-tp", rank, world);
//   ckpt::slice_load_report report;
//   auto tensors = ckpt::load_tensors(ckpt::open_checkpoint(path), {}, *sel, &report);
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckpt/load.h"
#include "ckpt/slice.h"

namespace ckpt {

/// This rank's part of each tensor the selection matches, under its full name, as a
/// contiguous CPU tensor of the slice's shape, then moved to options.device. Only the
/// slice's bytes are read: each piece of a key (the tensor held whole, or DCP chunks) is
/// met with the slice's box, and the shared elements are read as runs, one per row for a
/// column slice. Tensors saved under two names (tied weights) with one placement give one
/// tensor under both, still tied; with different placements each gets its own slice.
/// Throws errc::usage for a placement naming a dimension the tensor lacks, and with
/// options.mmap; errc::unsupported for a Shard or Range of a tensor not stored as row-major
/// bytes (quantized, sparse, a non-row-major view, packed sub-byte types): such a tensor
/// loads only whole (Replicate). Open a DCP checkpoint for it with
/// open_options::open_chunk = chunks_met_by(selection) (ckpt/slice.h): only the chunks the
/// slices meet are opened; a slice that meets a chunk not opened is errc::unsupported.
std::vector<std::pair<std::string, at::Tensor>> load_tensors(const checkpoint& c, const load_options& options,
                                                          const slice_selection& selection,
                                                          slice_load_report* report = nullptr);

}  // namespace ckpt
