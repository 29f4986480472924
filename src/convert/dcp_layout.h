// Internal: how convert --to dcp lays a plan out over K ranks (formats.md §9.9), shared by
// the data writer (write_dcp.cpp) and the `.metadata` writer (dcp_metadata_pickle.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/convert.h"

namespace ckpt::detail {

// One chunk of the output: rows [row0, row0 + rows) of tensor `tensor`, saved by `rank`.
struct band {
  size_t tensor = 0;
  int64_t row0 = 0, rows = 0;
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

// Shard(0) over `ranks` (DTensor's Shard.local_shard_size_and_offset): ceil(n / K) rows per
// rank, the trailing ranks fewer or none (an empty box at offset n). Boxes at the same
// offset are one item to DCP (its MetadataIndex is (fqn, offset)): the first rank's is kept,
// as _dedup_save_plans keeps one. A 0-dim tensor cannot be split: like a replicated tensor
// after deduplication it goes to the rank with the fewest bytes so far (the lowest on a tie).
dcp_layout lay_out(const convert_plan& plan, uint32_t ranks);

/// The `.metadata` pickle of the layout, its items at `places` (by band) and `byte_places`
/// (by plan.byte_items), decoded and checked again (§9.4) before it is returned: what
/// PyTorch 2.11's FileSystemWriter writes for that directory (§9.9).
std::vector<uint8_t> dcp_metadata_pickle(const checkpoint& c, const convert_plan& plan, const dcp_layout& layout,
                                         const std::vector<item_place>& places,
                                         const std::vector<item_place>& byte_places, const std::string& checkpoint_id);

}  // namespace ckpt::detail
