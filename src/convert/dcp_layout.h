// Internal: how convert --to dcp lays a plan out over K ranks (formats.md §9.9), shared by
// the data writer (write_dcp.cpp) and the `.metadata` writer (dcp_metadata_pickle.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/convert.h"

namespace ckpt::detail {

// One chunk of the output: the box offsets/sizes of tensor `tensor`, saved by `rank`.
struct band {
  size_t tensor = 0;
  uint32_t rank = 0;
  uint64_t nbytes = 0;  // as written
  std::vector<int64_t> offsets, sizes;  // the box in global coordinates
};

struct dcp_layout {
  std::vector<band> bands;
  std::vector<std::vector<size_t>> chunks;  // by tensor: its bands, in chunk order
  std::vector<std::vector<size_t>> items;   // by rank: its bands, in file order
};

// Where an item landed: its file and byte range.
struct item_place {
  uint32_t rank = 0;
  uint64_t offset = 0, length = 0;
};

inline std::string data_file_name(uint32_t rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

// Each tensor placed over a 1-D mesh of `ranks` (formats.md §9.9): its placement from
// `placements` (the first matching rule), else Shard(0), or Replicate() for a 0-dim tensor.
// Shard(d) cuts dimension d as DTensor does (Shard.local_shard_size_and_offset: ceil(n / K)
// per rank, the trailing ranks fewer or none, an empty box at offset n). Boxes at the same
// offsets (a replicated tensor, the empty boxes) are one item to DCP (its MetadataIndex is
// (fqn, offset)), kept by one rank as dedup_save_plans chooses it. Throws errc::usage for
// a Range placement or a dimension the tensor lacks.
dcp_layout lay_out(const convert_plan& plan, uint32_t ranks, const slice_selection* placements);

/// What write_dcp_files wrote: each band's and each BYTE_IO item's place (a band or item
/// of a file not written here keeps rank 0, offset 0, length 0) and the files written.
struct dcp_written {
  std::vector<item_place> places, byte_places;
  convert_result result;
};

/// The layout of `request` (its ranks and placements).
dcp_layout lay_out(const convert_plan& plan, const convert_request& request);

/// The bytes of each file of dcp_files' list, as written (`.metadata`, last, counts 0).
std::vector<uint64_t> dcp_file_bytes(const dcp_layout& layout, uint32_t ranks);

/// The rank files of the layout whose rank `mine` marks (empty: all) into `directory`,
/// each through an output_set marked set_staged(). Each file is byte for byte what the
/// whole directory's writer gives it.
dcp_written write_dcp_files(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                            const std::string& directory, const std::vector<bool>& mine,
                            const convert_request& request);

/// `.metadata` (dcp_metadata_pickle) into `directory`, staged; returns its size.
uint64_t write_dcp_metadata(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                            const dcp_written& written, const std::string& directory, const std::string& checkpoint_id);

/// The `.metadata` pickle of the layout, its items at `places` (by band) and `byte_places`
/// (by plan.byte_items), decoded and checked again (§9.4) before it is returned: what
/// PyTorch 2.11's FileSystemWriter writes for that directory (§9.9).
std::vector<uint8_t> dcp_metadata_pickle(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                                         const std::vector<item_place>& places,
                                         const std::vector<item_place>& byte_places, const std::string& checkpoint_id);

}  // namespace ckpt::detail
