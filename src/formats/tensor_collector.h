// Internal: turns the torch rebuild calls of a decoded pickle into tensor and storage
// records, validating every view against its storage. Shared by the zip, TorchScript and
// legacy readers, which differ only in how a storage's persistent id maps to bytes.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.h"
#include "base/pointer_map.h"
#include "pickle/node_marks.h"

namespace ckpt::detail {

/// What a storage persistent id says: ('storage', type, key, location, numel[, view]).
struct storage_ref {
  std::string key;
  std::optional<dtype> typed;     // nullopt for UntypedStorage (numel counts bytes)
  std::string location;
  uint64_t numel = 0;
  uint64_t view_offset_elements = 0;  // legacy files: storage views of a root storage
  uint64_t pid_offset = 0;        // stream offset, for errors
};

/// Parses a persistent id node; throws corrupt if it is not a storage reference.
storage_ref parse_storage_pid(const pickle::value* pid_node, bool legacy);

/// A storage a binder found: its index, and its size in bytes (what views are checked
/// against; its record, when one is kept, says the same).
struct bound_storage {
  size_t index;
  uint64_t nbytes;
};

class tensor_collector {
 public:
  /// `bind` maps a storage reference (with the element type the tensor finally uses) to a
  /// storage index in `ckpt.storages`, creating the record on first use (or, when the
  /// binder keeps no records, the index it would have had).
  using binder = std::function<bound_storage(const storage_ref&, dtype element_type)>;

  /// `max_tensors` bounds ckpt.tensors as a whole (several collectors may fill it).
  /// `paths` false (open_options::purpose::rewrite_pickle) keeps no paths and no aliases:
  /// they are charged against max_values all the same, so the same files are refused.
  tensor_collector(checkpoint& ckpt, binder bind, const pickle::limits& lim, uint64_t max_tensors, bool legacy,
                   bool paths = true)
      : ckpt_(ckpt), bind_(std::move(bind)), max_depth_(lim.max_depth), max_values_(lim.max_values),
        max_tensors_(max_tensors), legacy_(legacy), paths_(paths) {}

  /// Walks `doc` from its root, recording every tensor at the first path it is reached by.
  void collect(const pickle::document& doc);

 private:
  void walk(const pickle::value* v, value_path& path, uint64_t depth);
  /// Interprets a rebuild call; returns false when `v` is not a tensor rebuild.
  bool try_tensor(const pickle::value* v, value_path& path);
  tensor_record rebuild(const pickle::value* call, uint64_t depth);
  void tensor_bits(const pickle::value* metadata, tensor_record& t);
  /// _rebuild_qtensor's quantizer_params for the quantized tensor `t`.
  quantization quantizer(const pickle::value* params, const tensor_record& t, uint64_t depth);
  /// A per-channel scale or zero-point vector: a tensor of its own, or a list of numbers.
  void channel_values(const pickle::value* v, const tensor_record& t, int64_t axis, uint64_t depth, bool zero_points,
                      quantization& q);
  void validate_view(const tensor_record& t, const bound_storage& s, const std::string& key, uint64_t offset) const;
  /// One more tensor on r's storage, when its record is kept.
  void count_tensor(const tensor_record& r);

  // Tensors that are not one strided view (tensor_kinds.cpp).
  tensor_record sparse(const pickle::value* call, uint64_t depth);
  tensor_record nested(const pickle::value* call, uint64_t depth);
  /// NestedTensor.__reduce_ex__: _rebuild_njt({values, offsets, lengths, ...}).
  tensor_record jagged(const pickle::value* call, const pickle::value* njt_args, uint64_t depth);
  /// _rebuild_wrapper_subclass(cls, ...) under _rebuild_from_type_v2, with the object's state.
  tensor_record wrapper_subclass(const pickle::value* call, const pickle::value* wrapper_args,
                                 const pickle::value* state, uint64_t depth);
  /// One of a composite tensor's parts: a plain tensor with data, its storage counted.
  std::shared_ptr<const tensor_record> component(const pickle::value* v, uint64_t depth, const std::string& what);
  /// A size or stride tuple, charged to the budget below past its 64th entry.
  std::vector<int64_t> dims(const pickle::value* v, const char* what);

  /// Entries past the 64th of all size and stride tuples read (8 MiB as int64).
  static constexpr uint64_t kDimsPast64Budget = uint64_t(1) << 20;

  /// Counts a path about to be stored (a tensor's or an alias's) against max_values.
  void charge_path(const value_path& path, const pickle::value* at);

  checkpoint& ckpt_;
  binder bind_;
  uint64_t max_depth_;
  uint64_t max_values_;
  uint64_t path_values_ = 0;
  uint64_t max_tensors_;
  bool legacy_;
  bool paths_;
  // The tensor record of each node already read (a parameter's data tensor is its
  // parameter's). Most checkpoints never ask (no tensor is reached twice), so the map is
  // built on the first alias: until then a bit per node says which are tensors, and only
  // the nodes that are not their record's own are listed (a map here was 32 MB at open's
  // peak for a million tensors).
  const size_t* tensor_of_node(const pickle::value* v);
  void set_tensor_of_node(const pickle::value* v, size_t index, bool records_own);
  std::unique_ptr<node_marks> tensor_marks_;
  std::vector<std::pair<const pickle::value*, size_t>> other_tensor_nodes_;
  std::unique_ptr<pointer_map<size_t>> tensor_of_node_;
  size_t first_tensor_ = 0;  // this walk's first record (several collectors fill ckpt.tensors)
  pointer_map<bool> visited_;
  uint64_t dims_past_64_ = 0;
};

/// Binder for the zip archive of ckpt.files[file]: storage key k lives in record data/<k>
/// (or constants/<k> for TorchScript constants when `record_dir` says so). Without
/// `records` it checks every storage the same way but adds nothing to ckpt.storages, and
/// numbers the storages from `first_index` (after an earlier binder's of the same archive).
tensor_collector::binder zip_storage_binder(checkpoint& ckpt, uint32_t file, std::string record_dir,
                                            bool records = true, size_t first_index = 0);

}  // namespace ckpt::detail
