// The one policy for outputs that are directories: a checkpoint of several files (a
// Hugging Face shard set, a torch.distributed.checkpoint directory) written as a set.
// output_set.h is the single-file policy; this one follows it (security.md W1-W5,
// formats.md §11 is the protocol):
//   - Declared up front, refused before anything is written (errc::usage): OUTDIR that is
//     a file, a device or a dangling symlink; OUTDIR that is an input directory, lies
//     inside one, or contains one or the real directory of an input file, compared by
//     identity (device, inode of each ancestor), not spelling; OUTDIR holding files that
//     are not a previous set of the same layout, unless `force`; a new file that would
//     replace a file that is not of the previous set (even with `force`); a previous set
//     of another layout, or one whose index cannot be read (no way to tell its files).
//   - A layout writer fills a staging directory with the new set's files (flat names),
//     each through an output_set marked set_staged().
//   - commit(): OUTDIR absent, the staging directory (beside it) is renamed to it. OUTDIR
//     present, the previous index (or .metadata) is moved aside first, the new files are
//     moved in one by one (a file they replace kept aside), the new index last; then the
//     previous set's files are removed, and only they. A failure before the last rename
//     puts everything back. No reader ever sees old and new files under one index.
//   - The staging directory is held in the signal registry: a signal before the commit
//     removes it and what it holds (remove_temporaries_in_progress()).
//   - A SIGKILL leaves no handler to run: the staging directory holds an owner file that
//     its process keeps flock()ed until the commit begins, and open() removes the staging
//     directories of this OUTDIR whose owner file nobody holds (formats.md §11.1,
//     "Abandoned staging directories").
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "ckpt/input_file.h"

namespace ckpt {

enum class set_layout {
  hf_index,  // a `*.index.json` and the shards its weight_map names
  dcp,       // `.metadata` and the `*.distcp` files
};

class output_dir {
 public:
  /// `path`: OUTDIR as given. `force`: OUTDIR may hold other files, which are left alone.
  output_dir(std::string path, set_layout layout, bool force);
  /// Removes the staging directory of a set that was not committed.
  ~output_dir();
  output_dir(const output_dir&) = delete;
  output_dir& operator=(const output_dir&) = delete;

  /// A file the command reads (index, shard, .metadata, ...): a regular file (errc::usage
  /// otherwise), fingerprinted for commit(); its real directory counts as an input one.
  void add_input(const std::string& path);
  /// A single input file whose directory may hold OUTDIR (model.pt beside out/) or be it:
  /// fingerprinted for commit(), and never one of the previous set's files that the commit
  /// replaces or removes (out/model.safetensors converted into out/), but no input directory.
  void add_input_file(const std::string& path);
  /// A directory the command reads from (the one holding the index or .metadata).
  /// Returns its permission bits, which a new OUTDIR gets.
  mode_t add_input_dir(const std::string& path);

  /// Runs every refusal above for a set of `names` (flat file names; `last` among them is
  /// the index or .metadata), then creates the staging directory. Throws errc::usage for a
  /// refusal, errc::io for a failing system call.
  void open(const std::vector<std::string>& names, const std::string& last);

  /// OUTDIR as given.
  const std::string& path() const { return path_; }
  /// Where the writer puts file `name` of the new set (after open()).
  std::string staged(const std::string& name) const { return staging_ + "/" + name; }
  /// The staging directory itself (after open()), for a writer that fills a directory
  /// (the DCP re-writer): it must write exactly the names given to open(), flat.
  const std::string& staging_directory() const { return staging_; }
  /// The real directory the commit moves the set into (absolute, symlinks resolved; when
  /// absent, its real parent and its name), and whether it was absent at open(): then the
  /// commit is one rename of the staging directory to it (commit_witness.h).
  const std::string& target() const { return target_; }
  bool new_directory() const { return !exists_; }
  /// Files of the previous set in OUTDIR that the commit replaces or removes.
  const std::vector<std::string>& previous_set() const { return previous_; }
  /// Files in OUTDIR that are not of the previous set (left alone; non-empty only with force).
  const std::vector<std::string>& other_files() const { return others_; }
  /// Staging directories of this OUTDIR that open() found abandoned (their process gone
  /// before its commit) and removed.
  const std::vector<std::string>& abandoned_removed() const { return abandoned_; }

  /// The file in a staging directory that its process holds locked while the directory is
  /// in use (the name is never one of a set's files).
  static constexpr const char* owner_file = ".ckptool-owner";
  /// Removes `staging` (a staging directory of some output_dir, another process's) if it
  /// is abandoned: it holds an owner file that nobody has locked, and nothing but plain
  /// files. True when it was removed. Never throws.
  static bool remove_if_abandoned(const std::string& staging) noexcept;

  /// Checks that no input changed, then moves the new set into place (see above). Throws
  /// errc::io; before the last rename every file is as it was.
  void commit();

 private:
  void check_identity();
  void find_previous_set(const std::vector<std::string>& listing);
  void commit_new_directory();
  void commit_into_existing();
  void discard() noexcept;
  void remove_abandoned(const std::string& home);
  void take_ownership();

  std::string path_;      // as given
  std::string target_;    // the real directory (or, absent, its real parent + "/" + name)
  std::string parent_;    // the real parent
  bool exists_ = false;
  set_layout layout_;
  bool force_;
  mode_t mode_ = 0755;
  bool have_mode_ = false;
  struct input {
    std::string path;
    file_fingerprint fp;
  };
  std::vector<input> inputs_;
  std::vector<std::string> input_dirs_;  // real paths
  std::vector<std::string> names_;
  std::string last_;
  std::vector<std::string> previous_;
  std::string previous_last_;  // the previous set's index or .metadata ("" when none)
  std::vector<std::string> others_;
  std::string staging_;
  int registry_slot_ = -1;
  int owner_fd_ = -1;  // the owner file, flock()ed, while the staging directory is ours
  std::vector<std::string> abandoned_;
  bool committed_ = false;
};

}  // namespace ckpt
