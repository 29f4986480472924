// `ckptool diff A B`: whether two checkpoints, in any formats ckptool reads, hold the same
// model. Keys are paired by name, or through the wrapper-segment edit rekey --match finds
// (match_keys); paired tensors are compared by dtype, shape and value. Values are read
// streaming, a bounded window of each side at a time, compared as bytes first and decoded
// to numbers only where the bytes differ (docs/formats.md §12), with torch.allclose's rule.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/rekey.h"

namespace ckpt {

struct diff_options {
  /// torch.allclose(A, B, rtol, atol, equal_nan): |a - b| <= atol + rtol * |b|. Zero for
  /// both (the default) asks for equal values.
  double atol = 0;
  double rtol = 0;
  /// NaN against NaN counts as equal (bit-identical elements are equal regardless).
  bool equal_nan = false;
  /// Keys, dtypes, shapes and entries only: no tensor byte is read.
  bool metadata_only = false;
  /// Non-tensor entries (epoch, hyper-parameters, optimizer state) are not compared.
  bool ignore_entries = false;
  /// Safetensors __metadata__ maps are not compared (docs/formats.md §12.4).
  bool ignore_metadata = false;
  /// Bytes of each side read at a time (memory holds about 3 windows, and a non-contiguous
  /// view's storage span, at most 256 MiB: src/diff/key_reader.h). 1 MiB: the copy
  /// from the page cache and the memcmp after it stay in the CPU's cache; 16 MiB windows
  /// cost 45% more CPU time on two 2 GiB files (docs/findings.md).
  uint64_t window_bytes = 1ull << 20;
  /// Called with (bytes compared, bytes to compare) as the values are read.
  std::function<void(uint64_t, uint64_t)> progress;
  /// Edits of A's keys (rekey's operations, applied in order) before the keys are paired:
  /// with {strip_compiled}, "is B A with every `_orig_mod.` removed?" is answered
  /// equivalent when it is, where without it the keys are reported renamed (not
  /// equivalent). Reports name A's keys as A holds them. Two keys the edits make one, or a
  /// key they make empty, are errc::usage. Entries (non-tensor values) are not renamed.
  std::vector<key_op> edit_a;
};

/// What the values of a pair of tensors gave.
enum class value_verdict {
  identical,     // every element's bits are equal (and so are the dtypes)
  equal,         // every element is equal as a number (-0.0 vs 0.0, NaN payloads with equal_nan)
  close,         // within the tolerances, some elements not equal
  different,     // some elements outside the tolerances
  not_compared,  // shapes differ, --metadata-only, or a dtype without a numeric decode
};
/// "identical", "equal", "close", "different", "not-compared".
const char* verdict_name(value_verdict v);

struct tensor_diff {
  std::string key_a, key_b;  // equal unless paired through a rename
  dtype type_a = dtype::float32, type_b = dtype::float32;
  std::vector<int64_t> shape_a, shape_b;
  value_verdict values = value_verdict::not_compared;
  std::string not_compared_reason;  // why, when values == not_compared and shapes agree
  uint64_t elements = 0;
  uint64_t bits_differ = 0;    // elements whose bytes differ (same dtype), or values (dtypes differ)
  uint64_t not_equal = 0;      // elements not equal as numbers
  uint64_t outside = 0;        // elements outside the tolerances
  uint64_t nan_mismatches = 0; // NaN on one side only (or on both, without equal_nan)
  double max_abs_error = 0;    // over elements whose difference is a number (inf when one side is)
  double max_rel_error = 0;    // |a - b| / |b|; inf where b is 0 and a is not
  std::optional<uint64_t> first_outside;  // row-major index of the first element outside

  bool dtype_differs() const { return type_a != type_b; }
  bool shape_differs() const { return shape_a != shape_b; }
  /// Equivalent under the tolerances: same dtype and shape, values identical, equal or close.
  bool equivalent() const;
};

/// One side's value at a path of the non-tensor entries (docs/formats.md §12.4).
struct entry_value {
  std::string type;   // "int", "str", "tuple", "tensor", a class name, ...
  std::string value;  // Python's repr, cut at 200 characters
};

/// A non-tensor value that differs between the sides, or exists on one side only
/// (nullopt on the side that lacks it). `path` is its place below the entry, elements
/// joined by '/': "optimizer/param_groups/0/lr", "__metadata__/format".
struct entry_diff {
  std::string path;
  std::optional<entry_value> a, b;
};

struct diff_report {
  std::string path_a, path_b;
  std::string format_a, format_b;  // "torch-zip", "safetensors", ...
  std::string layout_a, layout_b;  // "file", "hf-shard-set", "dcp"
  size_t keys_a = 0, keys_b = 0;
  std::vector<std::string> only_in_a, only_in_b;
  /// Keys paired through a wrapper edit: rekey --match's description of it ("remove
  /// '_orig_mod.'"), and the pairs whose names differ (A's key, B's key).
  std::string rename_edit;
  std::vector<std::pair<std::string, std::string>> renamed;
  /// diff_options::edit_a as given (key_op::describe()), and those that changed no key.
  std::vector<std::string> edits_a, unused_edits_a;
  /// Every paired key, in A's order, then the tensors inside non-tensor entries (an
  /// optimizer's state in a torch.save file) paired by path, named by it.
  std::vector<tensor_diff> tensors;
  std::vector<entry_diff> entries;  // entries that differ or exist on one side only
  /// Entries compared by a rendering that was cut short (both equal up to the cut).
  size_t entries_elided = 0;
  uint64_t bytes_compared = 0;  // tensor bytes read, both sides
  bool metadata_only = false;

  /// Same keys (no rename), dtypes and shapes, every value within the tolerances, the same
  /// entries.
  bool equivalent() const;
};

/// Compares the checkpoints at `a` and `b` (paths as open_checkpoint takes them). Throws
/// ckpt::error for an input that cannot be read, or values that cannot be read exactly
/// (errc::unsupported naming the key: sparse, nested and quantized tensors).
diff_report diff_checkpoints(const std::string& a, const std::string& b, const diff_options& options,
                             const open_options& reader = {});

/// The same for checkpoints already open (tests over memory sources).
diff_report diff_checkpoints(const checkpoint& a, const checkpoint& b, const diff_options& options);

}  // namespace ckpt
