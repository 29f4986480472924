// Internal: loads what a selection of keys needs when some keys are assembled from pieces
// (key_table.h): the storages as byte tensors (load_storages), and each assembled key as a
// tensor of its own, allocated empty on the device with its global shape and filled piece
// by piece straight from the file (assembly.h).
#pragma once

#include <ATen/ATen.h>

#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/load.h"

namespace ckpt::detail {

struct loaded_tensors {
  std::vector<at::Tensor> storages;                 // as load_storages returns them
  std::unordered_map<size_t, at::Tensor> assembled;  // by key index
  uint64_t piece_bytes = 0;                          // bytes the pieces hold
};

/// `needed`: the storages to load as byte tensors (load_storages; pieces' storages are
/// taken out, since they land in their tensors); `viewed`: the records
/// the caller makes tensors of (none may be a piece's: a storage is read into one place);
/// `assembled_keys`: the keys to assemble. Throws what plan_assembly throws, and
/// errc::unsupported for an assembled key --mmap cannot show as one mapping (anything but
/// a single piece that is the whole tensor).
loaded_tensors load_with_pieces(const checkpoint& c, std::vector<bool> needed, const std::vector<size_t>& viewed,
                                const std::vector<size_t>& assembled_keys, const load_options& options);

}  // namespace ckpt::detail
