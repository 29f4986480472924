// The one output policy every writer follows (security.md W1-W4).
//
// A command declares everything it reads and everything it writes in one output_set,
// before it writes anything:
//   - No output may be an input or another output, however spelled (`..`, `./`, doubled
//     slashes, a symlinked directory, a symlink, a hard link): errc::usage, up front.
//   - A file output is written to a temporary file next to its destination; nothing is
//     replaced until commit(), which renames every output into place together and last,
//     after each was fsynced. Any failure leaves every destination as it was.
//   - A symlink output keeps the link; its target is replaced. A character device, FIFO,
//     socket or `-` (standard output) is streamed into: no temporary file, no rename.
//     A directory or a block device is refused (errc::usage), and so is `-` when standard
//     output is a terminal.
//   - Every input is a regular file, fingerprinted when declared; commit() refuses
//     (errc::io, "changed while being read") if one changed since.
//
// The library installs no signal handler. A program that wants temporary files removed on
// a signal calls remove_temporaries_in_progress() from its own handler.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/input_file.h"
#include "ckpt/sys_io.h"

namespace ckpt {

class output_set;

/// One declared output. Its descriptor exists once the set is open()ed.
class output_file {
 public:
  /// The path as given on the command line (what messages name).
  const std::string& path() const { return path_; }
  /// Written as produced (device, FIFO, socket, standard output): no temporary file.
  bool is_stream() const { return stream_; }
  bool is_stdout() const { return stdout_; }
  int fd() const { return fd_; }
  /// The temporary file being written; empty for a stream.
  const std::string& temp_path() const { return temp_; }
  void write(const void* buf, size_t n) { write_all(fd_, buf, n, path_); }
  /// Tells the file the first `bytes_out` bytes are final, so the kernel can start writing
  /// them to the disk while the rest is still being produced: commit()'s fsync then waits
  /// for the tail only. Only a hint; errors surface at commit().
  void start_writeback(uint64_t bytes_out);

 private:
  friend class output_set;
  std::string path_;    // as given
  std::string target_;  // what is replaced: the path, or the file a symlink chain ends at
  std::string directory_;
  std::string temp_;
  std::string canonical_;  // realpath of the directory + the name: two spellings, one string
  bool exists_ = false;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  bool stream_ = false;
  bool stdout_ = false;
  bool socket_ = false;
  mode_t mode_ = 0644;
  int fd_ = -1;
  int registry_slot_ = -1;
  uint64_t writeback_started_ = 0;
  bool writeback_hint_works_ = true;
};

class output_set {
 public:
  output_set();
  /// Removes the temporary files of a set that was not committed.
  ~output_set();
  output_set(const output_set&) = delete;
  output_set& operator=(const output_set&) = delete;

  /// A file the command reads. Opened without blocking and refused unless a regular file
  /// (errc::usage; errc::io when missing); fingerprinted for commit(). `hint` ends the
  /// message that refuses an output naming this input (e.g. how to allow it).
  /// Returns the fingerprint (its mode is what outputs usually copy).
  file_fingerprint add_input(const std::string& path, const std::string& hint = {});

  /// Declares an output, created with permission bits `mode` (less the umask). Throws
  /// errc::usage for an empty path, a directory, a block device, `-` on a terminal, or a
  /// path that is an input or another output; errc::io when its directory is missing.
  /// `may_replace`: the path of one declared input this output may be (rekey --force),
  /// replaced only by the commit. The reference stays valid for the set's life.
  output_file& add_output(const std::string& path, mode_t mode = 0644, const std::string& may_replace = {});

  /// Creates every file output's temporary file and opens every stream (a FIFO's open
  /// waits for a reader, as a shell redirection does). Throws errc::io.
  void open();

  /// Checks that no input changed, fsyncs every file output and renames them all into
  /// place. Throws errc::io; then every destination holds what it held before (on file
  /// systems without renameat2's RENAME_EXCHANGE the old file is kept as a hard link
  /// until the end; where even that fails, an output already renamed stays). Streams
  /// were written as produced: a failure cannot take back what a reader already got.
  /// A failure to fsync a directory after every rename is reported (errc::io) with the
  /// outputs complete.
  void commit();

  /// The outputs lie in the staging directory of an output_dir (ckpt/output_dir.h), whose
  /// commit is the one readers see: this set's commit then does not count as the process's
  /// (commit_started() stays false), so a signal still removes the whole staging directory.
  void set_staged() { staged_ = true; }

  /// Re-checks the inputs' fingerprints only (errc::io naming the file that changed):
  /// what a read-only command calls before it reports.
  void check_inputs_unchanged() const;

  /// Some output writes to this process's standard output (`-`, or a path that is it):
  /// human-readable reports then belong on stderr.
  bool writes_stdout() const;
  bool empty() const { return outputs_.empty(); }

 private:
  struct input {
    std::string path;
    file_fingerprint fp;
    std::string hint;
  };
  void discard() noexcept;
  std::vector<input> inputs_;
  std::vector<std::unique_ptr<output_file>> outputs_;
  bool opened_ = false;
  bool committed_ = false;
  bool staged_ = false;
};

/// For a signal handler (async-signal-safe, lock-free): unlinks the temporary file of
/// every output whose set has not begun to commit (a committing set's temporary names
/// hold the previous files until its commit ends, so they are left alone). Returns
/// commit_started() negated: false when a commit of this process has begun.
bool remove_temporaries_in_progress() noexcept;

/// True once any output_set of this process began its commit's renames: a program that
/// runs one command can then let the command finish instead of dying on a signal (its
/// outputs are, or are about to be, complete). Async-signal-safe.
bool commit_started() noexcept;

}  // namespace ckpt
