// Which part of each tensor one rank of a tensor-parallel job loads (docs/formats.md §16):
// a placement in DTensor's vocabulary (Shard(d), Replicate()) or an explicit range of one
// dimension, chosen per key by the first matching glob of a plan. No LibTorch here: the
// loader that uses it is ckpt::load_tensors (ckpt/load.h).
//
//   ckpt::slice_selection s = ckpt::parse_slice_plan(R"J({"*o_proj.weight": "Shard(1)", "*": "Replicate()"})J",
//                                                    "plan.json", rank, world);
//   auto tensors = ckpt::load_tensors(c, options, s, &report);
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/dim_list.h"

namespace ckpt {

struct placement {
  enum class kind { replicate, shard, range };
  kind type = kind::replicate;
  int64_t dim = 0;     // shard, range; negative counts from the last dimension
  int64_t start = 0;   // range only
  int64_t length = 0;  // range only
};

/// "Shard(0)", "Shard(dim=1)", "Shard(-1)", "Replicate()", "Replicate", "Range(1, 0, 128)"
/// (dim, start, length); spaces ignored. Throws errc::usage naming `what` otherwise.
placement parse_placement(std::string_view text, const std::string& what = "placement");
/// The canonical spelling parse_placement reads back ("Shard(1)", "Replicate()", "Range(0, 4, 2)").
std::string placement_text(const placement& p);

/// [start, start + length) of one dimension.
struct dim_range {
  int64_t start = 0, length = 0;
  bool operator==(const dim_range& o) const { return start == o.start && length == o.length; }
};

/// Rank `rank`'s part of a dimension of `size` elements split in `world` as torch.chunk
/// splits it (and DTensor's Shard with it): chunks of ceil(size / world) elements, the last
/// one shorter, and ranks past the last chunk get an empty range at `size`.
dim_range chunk_range(int64_t size, int64_t rank, int64_t world);

/// The box (one range per dimension) that `p` gives rank `rank` of `world` in a tensor of
/// `shape`. Throws errc::usage for a dimension the tensor lacks (a 0-dim tensor has none)
/// or a range outside it; `what` names the key in the message.
std::vector<dim_range> slice_box(const placement& p, const std::vector<int64_t>& shape, int64_t rank, int64_t world,
                                 const std::string& what);

/// A plan: rules tried in order, the first whose glob (as Python's fnmatch.fnmatchcase:
/// '*' crossing dots) matches a key gives its placement; a key no rule matches is not
/// loaded.
struct slice_selection {
  std::vector<std::pair<std::string, placement>> rules;
  int64_t rank = 0, world = 1;
  /// The placement of `key`, or nullopt when no rule matches.
  std::optional<placement> match(std::string_view key) const;
};

/// A JSON object from glob to placement string, in the order written. Throws errc::usage
/// for invalid JSON, a duplicate glob, a value that is not a placement string, or a rank
/// outside [0, world).
slice_selection parse_slice_plan(const std::string& json_text, const std::string& what, int64_t rank, int64_t world);

/// For open_options::open_chunk: whether a DCP chunk (the box `offsets`, `sizes` of the key's
/// global `shape`) meets the slice `sel` gives its rank, that is whether load_tensors with
/// `sel` reads any of its bytes. Chunks of keys no rule matches, empty chunks and chunks
/// outside the rank's box are not opened; a placement load_tensors would refuse (a
/// dimension the tensor lacks) opens every chunk of its key and is refused there.
std::function<bool(const std::string& key, const dim_list& shape, const dim_list& offsets, const dim_list& sizes)>
chunks_met_by(const slice_selection& sel);

/// The plans known by name ("llama-tp"); nullopt for another name.
std::optional<slice_selection> slice_preset(std::string_view name, int64_t rank, int64_t world);

/// What a sliced load (load_tensors with a selection) read and returned.
struct slice_load_report {
  uint64_t bytes_read = 0;   // file bytes read: the slices', plus any bytes between rows read with them
  uint64_t slice_bytes = 0;  // bytes the returned tensors hold
  uint64_t full_bytes = 0;   // bytes the same keys hold whole
  size_t sliced = 0;         // keys loaded in part (Shard, Range)
  size_t whole = 0;          // keys loaded whole (Replicate)
  size_t left_out = 0;       // tensors no rule of the selection matched: not loaded
  std::vector<std::string> converted;  // --dtype conversions, as load_tensors lists them
};

}  // namespace ckpt
