// `ckptool verify FILE`: everything ckptool can check without loading tensors anywhere.
// Opening the checkpoint already validates the container (zip structure, safetensors
// ranges), the pickle, and every tensor view against its storage; verify adds the CRC-32
// of every zip record (reading all data once), records no tensor uses, and the globals
// torch.load(weights_only=True) would refuse. A shard set gets all of it for every shard,
// and its index's cross-check: errors are problems, warnings notes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/distributed.h"

namespace ckpt {

struct verify_report {
  std::string format;                    // empty when the file could not be opened
  std::string layout;                    // "file", "hf-shard-set", "dcp"; empty as format
  size_t files = 0;                      // files read (a shard set's shards)
  size_t tensors = 0;
  size_t records_checked = 0;            // zip records whose CRC was compared
  size_t records_without_crc = 0;        // saved with CRC computation off (CRC field 0)
  uint64_t bytes_checked = 0;
  std::vector<std::string> problems;     // each a one-line description; empty = verified
  std::vector<std::string> notes;        // not failures
  std::vector<std::string> unsafe_globals;
  bool ok() const { return problems.empty(); }
};

/// Checks `path`. Problems in the file are reported, not thrown; only I/O errors and
/// usage errors throw ckpt::error.
verify_report verify_file(const std::string& path, const open_options& options,
                          const std::function<void(uint64_t, uint64_t)>& progress = {});

/// verify_file by every rank of `group` together (docs/distributed.md): each rank opens the
/// checkpoint and checks its metadata, then computes the CRC-32 of its share of the zip
/// records (contiguous runs in file order, balanced by bytes: each data byte is read by one
/// rank), calls `after_check` (the caller's own checks, e.g. that no input changed), and
/// the shares are gathered. Every rank returns the same report, the one verify_file gives.
/// An error on any rank is thrown on every rank (run_collectively); `progress` counts this
/// rank's share.
verify_report verify_file(const std::string& path, const open_options& options, process_group& group,
                          const std::function<void(uint64_t, uint64_t)>& progress = {},
                          const std::function<void()>& after_check = {});

}  // namespace ckpt
