// Key edits for `ckptool rekey` and for aligning a checkpoint to a model (materialize
// --model): strip, add or rename key segments, so compiled and uncompiled checkpoints (and
// DDP, FSDP, activation-checkpointing and Lightning ones) load into each other.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/dtype.h"

namespace re2 {
class RE2;
}

namespace ckpt {

struct checkpoint;

struct key_op {
  enum kind_t { strip_compiled, strip_wrappers, strip_prefix, add_prefix, add_compiled, rename, map };
  kind_t kind;
  std::string arg;         // prefix, module path, "REGEX=REPLACEMENT" as given, or map origin
  std::string replacement; // rename: the replacement in RE2 rewrite syntax (\1)
  std::shared_ptr<const re2::RE2> pattern;    // rename
  std::map<std::string, std::string> mapping; // map: old -> new
  // --match only: module path -> module path, derived from `mapping` (tensor keys), so keys
  // that are not tensors (`_extra_state`) follow their tensors. Empty for a --map replay,
  // which renames exactly the keys its file lists.
  std::map<std::string, std::string> module_mapping;
  /// "--strip-compiled", "--rename 'a=b'": how the user spelled it, for reports.
  std::string describe() const;
};

/// An operation that needs at most a plain argument (strip_*, add_prefix, add_compiled).
inline key_op make_op(key_op::kind_t kind, std::string arg = {}) {
  key_op op;
  op.kind = kind;
  op.arg = std::move(arg);
  return op;
}

/// Parses "--rename REGEX=REPLACEMENT": REGEX in RE2 syntax, split from REPLACEMENT at the
/// first '=' that no backslash escapes (`\=` is a literal '=' in RE2); REPLACEMENT takes
/// $1..$9, $& and $$. Throws errc::usage naming the spec on a bad pattern or replacement.
key_op make_rename_op(const std::string& spec);

/// A map operation from old -> new key pairs. With `follow_modules` (--match, whose mapping
/// lists tensors only) keys it does not list follow their module's move; without (--map)
/// only the listed keys change.
key_op make_map_op(std::map<std::string, std::string> mapping, std::string origin, bool follow_modules);

/// Applies one operation to a state-dict key. Returns the key unchanged when the
/// operation does not apply to it.
std::string apply_op(const key_op& op, const std::string& key);

struct rekey_plan {
  std::vector<std::pair<std::string, std::string>> mapping;  // old -> new, input order
  std::vector<std::string> unused_ops;  // operations that changed no key (likely typos)
  /// New names claimed by more than one old key (renamed, or left as it was): {new, [old, ...]}.
  std::vector<std::pair<std::string, std::vector<std::string>>> collisions;
  /// Old keys an operation renamed to the empty string.
  std::vector<std::string> emptied;
  size_t changed = 0;
};

/// Runs the operations in order over `keys` (taken by value: move them in to spare a copy).
rekey_plan plan_rekey(std::vector<std::string> keys, const std::vector<key_op>& ops);

/// How module paths move, learned from a key mapping: for each renamed key whose last
/// segment is unchanged, its module path with the common trailing segments removed gives
/// a rule "old prefix -> new prefix" ("model._orig_mod.enc.w" -> "enc.w" teaches
/// "model._orig_mod" -> ""). Rules that contradict each other are dropped.
struct module_rules {
  std::vector<std::pair<std::string, std::string>> rules;  // old prefix -> new prefix
};
module_rules derive_module_rules(const std::vector<std::pair<std::string, std::string>>& key_mapping);

/// Where module path `path` (a `_metadata` key) goes: below a rule's old prefix it is
/// rewritten; a wrapper between the rule's unchanged part and its old prefix collapses into
/// the new prefix (as consume_prefix_in_state_dict_if_present merges them); else unchanged.
std::string map_module_path(const module_rules& rules, const std::string& path);

/// Module paths that a rule adds as new wrappers (the root and "module" when a rule maps ""
/// to "module._orig_mod"), each with the path it must precede.
std::vector<std::pair<std::string, std::string>> added_wrapper_paths(const module_rules& rules);

/// A tensor's identity for matching: name, dtype, shape.
struct keyed_tensor {
  std::string key;
  dtype type;
  std::vector<int64_t> shape;
};

struct match_result {
  bool ok = false;
  std::string edit;                   // human description of the edit chosen
  std::vector<std::pair<std::string, std::string>> mapping;  // source key -> target key
  std::vector<std::string> missing;     // target keys no source key maps to
  std::vector<std::string> unexpected;  // source keys that map to no target key
  std::vector<std::string> shape_mismatches;  // "key: [2, 3] vs [3, 2]"
  std::vector<std::string> dtype_mismatches;  // "key: float32 vs bfloat16"
  std::string ambiguity;              // non-empty when refused as ambiguous
};

/// Finds the wrapper-segment edit that makes `source`'s keys equal `target`'s: both sides
/// are reduced to their names without wrapper segments (optionally also without a leading
/// "model."), and keys are paired through those reduced names. Ambiguous when two keys on
/// one side reduce to the same name, or when two reductions give different full matches.
match_result match_keys(const std::vector<keyed_tensor>& source, const std::vector<keyed_tensor>& target);

/// The state dict's tensors as the solver sees them (key, dtype, shape).
std::vector<keyed_tensor> keyed_tensors(const checkpoint& c);

/// What a caller of align_keys accepts beyond a pairing of every key on both sides.
struct align_policy {
  std::string target;             // names the target in messages: "the model", "--match t.pt"
  std::string target_noun = "target";  // "1 model tensors are missing ..."
  bool allow_missing = false;     // target keys no checkpoint key maps to
  bool allow_unexpected = false;  // checkpoint keys that map to no target key
  std::string missing_hint;       // appended to the missing-keys refusal
};

/// match_keys, then the refusals every aligning command makes, worded once (rekey --match,
/// materialize --model, the library's load_module): an ambiguous edit, keys left unpaired
/// that the policy does not accept, shapes that differ. Throws errc::check_failed naming
/// `file`. Dtype differences are the caller's to report (result.dtype_mismatches).
match_result align_keys(const std::vector<keyed_tensor>& source, const std::vector<keyed_tensor>& target,
                        const align_policy& policy, const std::string& file);

/// Writes / reads the `--save-map` / `--map` JSON: {"ckptool_key_map": 1, "mapping": {old: new}}.
/// Reading refuses (usage) invalid JSON, a duplicate key in any object and a value that is
/// not a string, and (unsupported) a missing or unknown "ckptool_key_map" version.
std::string mapping_to_json(const std::vector<std::pair<std::string, std::string>>& mapping);
std::map<std::string, std::string> mapping_from_json(const std::string& text, const std::string& file);

/// The format version mapping_to_json writes and mapping_from_json reads.
constexpr int kKeyMapVersion = 1;

}  // namespace ckpt
