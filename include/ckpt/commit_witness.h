// What another process can tell of an output_dir's commit from the file system alone,
// when the committing process is lost before it says how its commit went: the other ranks
// of a parallel convert whose rank 0 was killed once it may have decided to commit
// (docs/distributed.md, "Steps and failure semantics").
//
// Only a new OUTDIR can be told. Its commit is one rename of the staging directory to
// OUTDIR, so the identity (device, inode) of what stands at OUTDIR says which side of that
// rename the process died on. An OUTDIR that existed is committed by many renames, whose
// progress only the committing process knew: nullopt. Either way the answer stands only
// once the committer is gone: the owner file it keeps flock()ed until it exits
// (output_dir::owner_file) must be unlocked, or it may rename yet.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace ckpt {

class commit_witness {
 public:
  /// Made once the staging directory exists and before the commit begins (commit()
  /// unlinks the owner file; the witness holds it open from here). `target` and
  /// `new_directory` are the committer's output_dir::target() and new_directory().
  commit_witness(std::string staging, std::string target, bool new_directory);
  ~commit_witness();
  commit_witness(const commit_witness&) = delete;
  commit_witness& operator=(const commit_witness&) = delete;

  /// true: the set is in place, for good (OUTDIR's parent is synced here, in case the
  /// committer died before it did). false: it is not and never will be; the staging
  /// directory, abandoned, is removed. nullopt: the committer still holds its owner file
  /// (alive; waited for up to 5 s, as the kernel may drop a dead process's lock a while
  /// after its connections), an OUTDIR that existed, or a file system without flock().
  std::optional<bool> committed() noexcept;

 private:
  std::string staging_, target_;
  bool new_directory_;
  int owner_fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace ckpt
