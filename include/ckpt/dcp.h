// torch.distributed.checkpoint (DCP) directories: the `.metadata` file, decoded by our own
// pickle machine under a vocabulary of DCP's dataclasses (docs/formats.md §9), and the
// check that a tensor's chunks tile its global shape exactly.
//
// PyTorch reads `.metadata` with an unrestricted pickle.load; we never import or call
// anything. A `.metadata` that names a global outside the DCP vocabulary is refused as
// unsafe (what pickle.load would import and run), with every such global named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/dim_list.h"
#include "ckpt/dtype.h"
#include "ckpt/pickle.h"

namespace ckpt::dcp {

// Boxes and shapes are dim_lists (a std::vector<int64_t> look-alike that keeps up to three
// dimensions inline, ckpt/dim_list.h): a directory of 20,000 keys x 4 ranks has 80,000
// chunks and as many storage entries, and a heap block per coordinate list was a third of
// the decoder's time, spent again freeing them.

/// One saved piece of a tensor: a box in the global tensor's coordinates.
struct chunk {
  dim_list offsets;
  dim_list sizes;
  uint64_t at = 0;  // byte offset in .metadata of the ChunkStorageMetadata, for errors
  uint32_t source = 0;  // which of metadata::sources listed it (rank-local merges)
};

struct tensor_meta {
  dtype type = dtype::float32;
  dim_list size;  // global shape
  std::vector<chunk> chunks;
  // TensorProperties' other fields; PyTorch marks them deprecated, only dtype matters.
  std::string layout = "torch.strided";
  bool requires_grad = false;
  int64_t memory_format = 0;  // _MEM_FORMAT_ENCODING: 0 contiguous, 1 channels_last, 2 preserve
  bool pin_memory = false;
};

/// An entry of state_dict_metadata: a tensor, or a BYTE_IO item (a torch.save blob of any
/// Python value, which this layer never opens).
struct item {
  std::string fqn;
  bool is_tensor = false;
  tensor_meta tensor;  // when is_tensor
  uint64_t at = 0;     // byte offset of the entry's object in .metadata
};

/// One storage_data entry: where the bytes of one chunk (or one BYTE_IO item) are.
struct storage_item {
  std::string fqn;
  std::optional<dim_list> offsets;  // the chunk's offsets; none for BYTE_IO
  std::optional<int64_t> index;                 // a hint only (never part of the lookup)
  std::string relative_path;                    // file name inside the DCP directory
  uint64_t offset = 0;                          // byte range in that file
  uint64_t length = 0;
  // Stream transforms to undo, in the order FileSystemReader applies them ("stream.zstd/1").
  std::vector<std::string> transform_descriptors;
  uint64_t at = 0;
  uint32_t source = 0;  // which of metadata::sources listed it (rank-local merges)
};

/// One element of a planner_data path: a mapping key or a list index.
struct path_element {
  bool is_index = false;
  std::string key;
  int64_t index = 0;
};

struct planner_path {
  std::string fqn;
  std::vector<path_element> path;
};

struct storage_meta {
  std::string checkpoint_id;  // str, or a pathlib path joined back into one string
  std::string save_id;
  std::optional<std::string> load_id;
  std::vector<std::string> modules;  // 2.7+; empty before
};

struct metadata {
  std::vector<item> items;  // state_dict_metadata, in file order
  std::vector<storage_item> storage_data;
  // planner_data: fqn -> original nesting path. Absent (or None: flatten_state_dict=False)
  // gives has_planner_data false; a value of another form (a custom planner's) sets
  // planner_data_opaque and is not decoded.
  bool has_planner_data = false;
  bool planner_data_opaque = false;
  std::vector<planner_path> planner_data;
  std::optional<storage_meta> writer_meta;  // Metadata.storage_meta, 2.4+ (None or absent before)
  std::optional<std::string> version;   // "1.0.0" since 2.9; absent before
  int protocol = 0;                     // pickle protocol announced by PROTO
  // Keys of Metadata's state this decoder does not know (Megatron-Core's mcore_data, ...):
  // tolerated, listed, not decoded.
  std::vector<std::string> unknown_fields;
  std::vector<std::string> globals;  // every global the pickle names, sorted

  // Set by merge_rank_local only. The metadata files merged, rank r's at index r (their
  // display names); errors about a chunk or storage entry name sources[its source].
  std::vector<std::string> sources;
  // A box (or BYTE_IO item) several ranks wrote, each its own copy: storage_data keeps the
  // lowest rank's, these are the others, for the reader to compare with it.
  std::vector<storage_item> replicas;
};

struct decode_options {
  pickle::limits lim;
};

/// Decodes the bytes of a `.metadata` file. Throws ckpt::error: corrupt (with the byte
/// offset), unsupported (a dtype or form this reader cannot represent exactly), unsafe (a
/// global outside the DCP vocabulary), limit. The caller names the file (with_file).
metadata decode_metadata(const uint8_t* data, size_t size, const decode_options& options = {});

/// Reads and decodes a whole `.metadata` file from `src` (larger than lim.max_pickle_bytes is
/// a limit error, read nothing); errors name src.name().
metadata decode_metadata(const byte_source& src, const decode_options& options = {});

/// True for a global the DCP vocabulary allows: the checkpoint dataclasses, torch.Size,
/// dtypes, layouts, pathlib paths, and the builtins the pickle machine folds into data.
bool is_dcp_global(std::string_view module, std::string_view name);

/// The chunks of one tensor tile its global shape exactly: every box inside the bounds,
/// no two boxes overlapping (identical boxes, a replicated chunk listed twice, count once),
/// and together covering every element. Zero-size boxes are legal anywhere inside the
/// bounds. Throws a corrupt ckpt::error naming the key and the offending box.
/// With `sources` (a rank-local merge), the error names the metadata file of the box.
void check_coverage(const std::string& fqn, const tensor_meta& t, const std::vector<std::string>& sources = {});

/// storage_data looked up as PyTorch's MetadataIndex compares entries: by fqn and chunk
/// offsets, `index` being only a hint (metadata.py:163). It points into the entries it was
/// built from, which must outlive it unchanged.
class storage_index {
 public:
  storage_index() = default;
  /// Throws a corrupt ckpt::error naming the first entry listed twice (and, with `sources`,
  /// the metadata file that listed it: a rank-local merge).
  explicit storage_index(const std::vector<storage_item>& entries, const std::vector<std::string>& sources = {});
  /// The entry of a chunk at `offsets` (a chunk's own dim_list, or any list of coordinates
  /// converted to one), or of a BYTE_IO item (offsets nullptr); nullptr if none.
  const storage_item* find(std::string_view fqn, const dim_list* offsets) const;

 private:
  const std::vector<storage_item>* entries_ = nullptr;
  std::vector<uint64_t> slots_;  // open addressing: entry index + 1 and a hash tag, 0 for empty
};

/// The storage index alone: every chunk and every BYTE_IO item has exactly one storage_data
/// entry (matched by fqn and offsets, as PyTorch's MetadataIndex compares), and every
/// storage_data entry belongs to a known item. Throws a corrupt ckpt::error naming, with
/// md.sources, the metadata file. Returns the index, over md.storage_data.
storage_index check_storage_index(const metadata& md);

/// check_coverage for every tensor, and the storage index: every chunk and every BYTE_IO
/// item has exactly one storage_data entry (matched by fqn and offsets, as PyTorch's
/// MetadataIndex compares), and every storage_data entry belongs to a known item. Returns
/// the index, over md.storage_data.
storage_index check_metadata(const metadata& md);

/// The rank of a rank-local metadata file's name (`__3.metadata` -> 3), written by
/// dcp.save(use_collectives=False) since PyTorch 2.9 (docs/formats.md §9.8); nullopt for
/// any other name.
std::optional<uint32_t> rank_local_metadata_rank(std::string_view name);

/// One view of a use_collectives=False save: `ranks[r]` is the decoded `__{r}.metadata`
/// (every rank from 0 up, none missing), `names[r]` its display name. Items are the union
/// of the ranks' (first seen order); a tensor's chunks are every rank's boxes; storage_data
/// keeps one entry per (fqn, offsets), the lowest rank's, the others going to `replicas`.
/// Throws a corrupt ckpt::error naming the file and byte when the files disagree: an item
/// a tensor in one and bytes in another, a dtype or global shape that differs, a
/// planner_data path that differs, a storage entry pointing outside its rank's own
/// `__{r}_` data files. Coverage is check_metadata's, on the result.
metadata merge_rank_local(std::vector<metadata> ranks, const std::vector<std::string>& names);

/// "(3, 0)": a box coordinate as errors and reports print it.
std::string format_shape(const dim_list& v);

}  // namespace ckpt::dcp
