// Internal: a checkpoint's non-tensor entries as the leaves diff compares (docs/formats.md
// §12.4). Every dict is walked into, so that the same value gives the same paths whether
// it was pickled whole (torch.save) or flattened item by item (a DCP directory's BYTE_IO
// items, which are dict paths joined with '.'); sequences are walked into too, and those
// DCP would keep whole also give a leaf of their own for their type and length. Tensors
// met on the way are leaves that name their record, for diff to compare as tensors.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

struct entry_leaf {
  std::string path;        // elements joined by '/': "optimizer/param_groups/0/lr"
  /// A letter per element of path: 's' a str dict key, 'k' another dict key (0 of an
  /// optimizer's state), 'n' a sequence index, 'o' a part of an object. Paths alike whose
  /// kinds differ are different places ({0: x} is not {"0": x}, nor [x]).
  std::string kinds;
  std::string type;        // Python's type name ("float", "tuple"), a class for an object, "tensor"
  std::string shown;       // Python's repr, cut at kShownChars
  std::string exact;       // what equality is decided on: raw text of str/bytes, else repr
  bool partial = false;    // `exact` was cut (or is a summary): equal text proves nothing
  std::optional<size_t> tensor;  // a tensor leaf with a record: index into checkpoint::tensors
  /// A tensor (or a summary of a value holding tensors) whose values have no record to be
  /// read from: diff refuses to compare values through it.
  bool unread_tensor = false;
  /// A tensor leaf's path joined by '.', elements as str(key): the key DCP's flattening
  /// gives the value at that path (docs/formats.md §12.4).
  std::string dotted;
};

/// Characters of a value a report shows; values are compared in full up to kExactChars.
constexpr size_t kShownChars = 200;
constexpr size_t kExactChars = 1u << 20;
/// Leaves one side may expand to: a pickle's memo can share one list many times over,
/// and a walk of such a DAG would grow without bound. Past it, diff refuses (unsupported).
constexpr size_t kMaxLeaves = 4'000'000;

/// The leaves of values open_checkpoint decodes from pickles of their own and drops (a DCP
/// BYTE_IO item, Lightning's meta.pt): `seen` is open_options::entry_value_seen.
class walked_values {
 public:
  explicit walked_values(std::string file);
  ~walked_values();
  void seen(const value_path& path, const pickle::value& v, const std::vector<entry_tensor>& tensors);

 private:
  friend std::vector<entry_leaf> entry_leaves(const checkpoint& c, const walked_values* walked);
  struct state;
  std::unique_ptr<state> s_;
  std::map<std::string, std::pair<size_t, size_t>> ranges_;  // entry path -> its leaves
};

/// c's entries as leaves, in the order found, each path once. Uses the entries' decoded
/// values (entry_summary::node) while they are alive, else what `walked` saw of them; an
/// entry with neither is a single leaf from its summary (partial when the summary was cut
/// or summarizes tensors). Throws errc::unsupported past kMaxLeaves.
std::vector<entry_leaf> entry_leaves(const checkpoint& c, const walked_values* walked = nullptr);

/// A shard index's own metadata as leaves "index/metadata/<key>" (but total_size and
/// total_parameters), and a safetensors checkpoint's __metadata__ as leaves "__metadata__/<key>" (type "str");
/// for a shard set, each key's value where every shard that has it agrees, and the
/// per-shard values where they do not. Empty for every other format.
std::vector<entry_leaf> metadata_leaves(const checkpoint& c);

}  // namespace ckpt::detail
