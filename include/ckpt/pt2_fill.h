// Filling a torch.export archive with a checkpoint's weights (`materialize CKPT --model
// EP.pt2 -o OUT.pt2`, formats.md §14.9): the checkpoint's keys are aligned to the archive's
// parameters and buffers by the same solver as every other --model, each tensor is checked
// against the archive's dtype and shape, and a new archive is written in which only the
// weight files (and, for an archive exported on the meta device, the payload configs and
// the program's device fields) differ. No LibTorch: the bytes go from the checkpoint's
// records to the new archive's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/convert.h"

namespace ckpt::pt2 {

/// A view of one output tensor file that takes a checkpoint tensor's bytes.
struct fill_view {
  size_t source = 0;                // index into fill_plan::sources
  std::string fqn;                  // the archive entry (for messages)
  int64_t offset = 0;               // in elements of the file
  std::vector<int64_t> shape, stride;
};

/// One tensor file of the output that is not the archive's byte for byte.
struct fill_file {
  std::string record;               // "data/weights/weight_3" (relative to the root)
  std::string base;                 // the archive record its other bytes come from; "" for zeros
  dtype type = dtype::uint8;
  uint64_t nbytes = 0;
  std::vector<fill_view> views;     // written in this order; overlapping views must agree
};

struct fill_plan {
  std::vector<std::string> programs;  // the programs filled, in the archive's order ("model")
  std::string key_edit;             // the solver's edit, for the report ("a: edit; b: edit" for several)
  // FQNs below are "<program>/FQN" when the archive holds several programs.
  std::vector<std::pair<std::string, std::string>> filled;  // archive FQN <- checkpoint key
  std::vector<std::string> kept;          // --no-strict: weights the checkpoint lacks, the archive's values kept
  std::vector<std::string> from_archive;  // constants (non-persistent buffers, lifted tensors, script
                                          // objects) and pickled entries the checkpoint does not hold
  std::vector<std::string> unexpected;    // checkpoint keys no filled program's tensor takes
  bool meta_export = false;         // some filled tensor had no data in the archive
  uint64_t bytes = 0;               // checkpoint bytes written

  // How to write it (write_filled).
  convert_request request;          // tensor_bytes' request (no cast)
  convert_plan sources;             // the checkpoint tensors used, contiguous
  std::vector<fill_file> files;
  /// Where files are written (indexes into files): at an archive record of the same name,
  /// which they replace, else right after the record. Records replaced by new text
  /// (configs, program) or dropped (a meta export's shared empty file, once nothing names it).
  std::vector<std::pair<std::string, std::vector<size_t>>> files_at;
  std::vector<std::pair<std::string, std::string>> new_text;
  std::vector<std::string> dropped;
};

/// Aligns `ckpt`'s state dict to the tensors of each program of `archive` (an
/// ExportedProgram archive, opened with open_checkpoint) named in `programs` (empty: every
/// program), each program on its own, and checks everything the write needs; the other
/// programs' records are copied as they are. Throws ckpt::error: usage for a name the
/// archive does not hold; check_failed when keys are ambiguous or (strict) a program's
/// weights are missing from the checkpoint; unsupported (naming the key) for a dtype or
/// shape that differs, a tensor with no data on either side, tied entries a checkpoint
/// cannot fill as one, a file a filled program shares with one left as it is.
fill_plan plan_fill(const checkpoint& ckpt, const checkpoint& archive, bool strict,
                    const std::vector<std::string>& programs = {});

/// The program `materialize --run` runs of `archive` (formats.md §14.9): the one name in
/// `requested` (--program), else the archive's only program, whatever its name. Throws
/// errc::usage, listing the archive's programs, for several names, for none with an
/// archive of several programs, and for a name the archive does not hold.
std::string program_to_run(const checkpoint& archive, const std::vector<std::string>& requested);

/// Writes the filled archive to `fd` (an empty file the caller commits): every record of
/// the archive in its order, under its root folder, 64-byte aligned, each copied byte for
/// byte unless the plan replaces it. Throws errc::unsupported when tied entries get
/// different values from the checkpoint, errc::corrupt / io when reading or writing fails.
void write_filled(const checkpoint& ckpt, const checkpoint& archive, const fill_plan& plan, int fd);

}  // namespace ckpt::pt2
