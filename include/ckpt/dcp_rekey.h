// `rekey` across a torch.distributed.checkpoint directory (docs/formats.md §9.7): the keys
// in `.metadata` are renamed where they appear (state_dict_metadata, every MetadataIndex.fqn
// in storage_data, planner_data's keys and nesting paths); every other file, `.distcp` data
// included, is copied byte for byte, never re-encoded.
//
// The directory is written into a staging directory the caller made (empty); the output
// policy (where it goes, --force, the commit) is the caller's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/file_opener.h"
#include "ckpt/pickle.h"
#include "ckpt/rekey.h"

namespace ckpt {

struct dcp_rekey_options {
  bool dry_run = false;  // plan and check everything, write nothing
  pickle::limits lim;    // for decoding .metadata (and reading the new one back)
  /// Called as bytes are written: (bytes so far, bytes in all).
  std::function<void(uint64_t, uint64_t)> progress;
};

struct dcp_rekey_result {
  /// Over every key .metadata names: state_dict_metadata's, then any only storage_data or
  /// planner_data name (none in a file PyTorch wrote).
  rekey_plan plan;
  size_t storage_renamed = 0;  // storage_data entries whose MetadataIndex.fqn changed
  size_t planner_renamed = 0;  // planner_data entries renamed (key and path)
  /// BYTE_IO items (new names): renamed, their values (torch.save blobs of any Python value
  /// in the data files) copied unopened.
  std::vector<std::string> byte_items;
  /// BYTE_IO items whose values could not be searched for renamed keys. Always empty: every
  /// value is searched, a zstd one inflated first, and one behind an unknown transform is
  /// refused (kept for the JSON report's `unchecked_byte_items`).
  std::vector<std::string> unchecked_byte_items;
  /// "item: module.name" for each global a BYTE_IO value names that torch.load(weights_only=
  /// True) would refuse: dcp.load unpickles these values with weights_only=False.
  std::vector<std::string> byte_item_globals;
  std::vector<std::string> data_files;   // files storage_data points into, copied verbatim
  std::vector<std::string> other_files;  // every other file (Lightning's meta.pt, ...), copied verbatim
  std::vector<std::string> unknown_fields;  // Metadata fields this reader does not know, kept as they were
  /// The metadata files rewritten: `.metadata`, or a use_collectives=False save's rank-local
  /// `__0.metadata` ... `__{N-1}.metadata` (docs/formats.md §9.8), each rewritten alone.
  std::vector<std::string> metadata_files;
  uint64_t metadata_bytes = 0;  // size of the new .metadata (all of them)
  uint64_t bytes_copied = 0;    // the other files together
};

/// Reads the DCP directory `in_dir` (relative to `in`'s root; "" is the root), renames its
/// keys with `ops`, and writes the result into `staging_dir` (a path on disk, an existing
/// empty directory): the new `.metadata` last, after every other file, as DCP writes it.
/// A directory of rank-local `__N.metadata` files (use_collectives=False) has each of
/// them rewritten, last, its keys planned over all ranks' together.
/// Everything is checked before anything is written. Throws ckpt::error:
///   check_failed  two keys would take one name, or a key the empty name; nothing written
///   unsupported   a rename .metadata cannot carry exactly (a planner_data path the edit
///                 spans several levels of, a custom planner's planner_data, an unknown
///                 Metadata field or a BYTE_IO value naming a renamed key (an optimizer's
///                 param_groups listing parameter FQNs), rank-local __N.metadata files
///                 left beside a .metadata, subdirectories)
///   unsafe / corrupt / limit  as decode_metadata; io  reading or writing failed
///   usage         staging_dir is not an empty directory
dcp_rekey_result write_rekeyed_dcp(const file_opener& in, const std::string& in_dir, const std::vector<key_op>& ops,
                                   const std::string& staging_dir, const dcp_rekey_options& options = {});

}  // namespace ckpt
