// `ckptool rekey` on a file: renames the state dict's keys (and, consistently, its
// `_metadata` module paths and any other dict whose keys mirror the state-dict keys, such
// as FQN-keyed optimizer state) and writes a new file of the same format. Everything else
// is kept exactly: non-tensor entries, opaque objects, shared storages, strides, offsets,
// and the tensor records, which are copied verbatim (copy_file_range) with their CRCs.
// The output is written into an output_file of the caller's output_set (which commits it)
// and, when it is a file, re-read before the commit can replace anything.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/output_set.h"
#include "ckpt/rekey.h"

namespace ckpt {

enum class unsafe_policy { refuse, keep, drop };

struct rekey_request {
  std::vector<key_op> ops;
  unsafe_policy unsafe = unsafe_policy::refuse;
  bool dry_run = false;
  /// Where to write, from an output_set that is open()ed; the caller commits it. Ignored
  /// for dry runs.
  output_file* output = nullptr;
  /// The limits the input was opened with: the output is read back under the same ones.
  open_options reader;
  /// Bytes of the output written so far, and the expected total (the input's size: the
  /// output differs only by the pickle). Called often; keep it cheap.
  std::function<void(uint64_t done, uint64_t total)> progress;
  /// Lets rekey_file free what it no longer needs as it goes: the input's tensor, alias,
  /// storage and entry lists before the output's pickle is made, the input's pickle
  /// document after, and (a file output) the input's archive once the output is compared
  /// with it, so the output's pickle is read back beside neither (for a million tensors
  /// these are most of the peak). Afterwards its file's pickle is null, every pointer into
  /// it is cleared (state_dict_node), c.tensors, c.aliases, c.storages, c.entries and c.keys
  /// are empty, and its file's zip is null unless the output is a stream: c keeps where its
  /// state dict was.
  bool release_input = false;
};

struct rekey_result {
  rekey_plan plan;                            // the state dict's keys, old -> new
  std::vector<std::string> mirrored_dicts;    // other dicts renamed with it (paths)
  size_t metadata_renamed = 0;                // `_metadata` module paths changed
  std::vector<std::string> dropped;           // entries removed by --drop-unsafe (paths)
  uint64_t bytes_written = 0;
  /// A torch.export archive (formats.md §14.8): constants renamed with the state dict, and
  /// places in the programs that named a renamed parameter, buffer, constant or module.
  size_t constants_renamed = 0;
  size_t program_references = 0;
};

/// Plans the renaming over `c` (opened with open_checkpoint) and, unless dry_run, writes
/// the output. Throws ckpt::error: check_failed when two keys would get one name (the
/// plan's collisions are listed in the message; nothing is written); unsafe when the pickle
/// names unsafe globals and the policy is refuse; unsupported for TorchScript (names live
/// in its code), legacy files, and a torch.export archive whose names cannot all be
/// renamed exactly (§14.8); io when writing fails (nothing is committed).
rekey_result rekey_file(checkpoint& c, const rekey_request& request);

/// The keys rekey_file plans over, in the file's order: every safetensors tensor, or the
/// string keys of the state dict found (errc::unsupported, naming the file, when none is).
std::vector<std::string> rekey_keys(const checkpoint& c);

}  // namespace ckpt
