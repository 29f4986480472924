// How a checkpoint made of several files is reached: by names relative to one directory
// (an index's shard names, a DCP `.metadata`'s relative_path), through an interface with a
// real implementation rooted at a directory and an in-memory one, so multi-file cases are
// unit tests without touching the disk (as LevelDB's Env and memenv).
//
// Names that come from inside a file are hostile: every method refuses one that could
// leave the root (absolute, a ".." component, a NUL byte) before touching anything
// (security.md §2.E).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/byte_source.h"

namespace ckpt {

enum class file_kind { missing, regular, directory, other };

struct file_stat {
  file_kind kind = file_kind::missing;
  uint64_t size = 0;  // regular files
};

class file_opener {
 public:
  virtual ~file_opener() = default;
  /// A regular file, read-only, with the protections of every input (input_file.h):
  /// FIFOs, devices, sockets and directories refused at once (errc::usage), symbolic
  /// links followed as for a file named on the command line.
  virtual std::unique_ptr<byte_source> open(const std::string& relative) const = 0;
  /// The names in a directory ("" is the root), sorted, without "." and "..".
  virtual std::vector<std::string> list(const std::string& relative) const = 0;
  virtual file_stat stat(const std::string& relative) const = 0;
  /// The name messages use for `relative`: the root joined with it, as a user would type it.
  virtual std::string display(const std::string& relative) const = 0;
};

/// Why `name`, read from a file, is not a plain relative path below a directory, as a
/// phrase ("goes up a directory (\"..\")"); "" when it is one. The one rule for every name
/// a file gives another file by (a shard index's shard names, a DCP `.metadata`'s
/// relative_path, every name a file_opener is asked for): not empty, no NUL byte, not
/// absolute, no drive letter ("C:x"), no backslash (a separator on Windows, where the same
/// name would be another path), no ".." component (even one that would come back inside:
/// no writer produces it, and lexical folding is wrong across symbolic links), no empty or
/// "." component ("a//b", "./x", "sub/"): what no writer writes is not guessed at.
std::string relative_name_problem(std::string_view name);

/// `name` checked by relative_name_problem, returned unchanged; "" is the root itself.
/// Throws errc::unsafe, the name escaped, for anything else: nothing may escape the root.
std::string checked_relative_path(std::string_view name);

/// The file system below `root` ("" is the current directory).
class disk_opener final : public file_opener {
 public:
  explicit disk_opener(std::string root);
  std::unique_ptr<byte_source> open(const std::string& relative) const override;
  std::vector<std::string> list(const std::string& relative) const override;
  file_stat stat(const std::string& relative) const override;
  std::string display(const std::string& relative) const override;

 private:
  std::string root_;
};

/// Files held in memory, by relative path ("run/.metadata"); a directory exists when a
/// file lies below it. For tests and fuzzers.
class memory_opener final : public file_opener {
 public:
  explicit memory_opener(std::string root_name = "<memory>");
  /// Adds (or replaces) a file. `relative` is checked as a name from a file would be.
  void add(const std::string& relative, std::vector<uint8_t> bytes);
  void add(const std::string& relative, std::string_view text);
  std::unique_ptr<byte_source> open(const std::string& relative) const override;
  std::vector<std::string> list(const std::string& relative) const override;
  file_stat stat(const std::string& relative) const override;
  std::string display(const std::string& relative) const override;

 private:
  std::string root_name_;
  std::map<std::string, std::vector<uint8_t>> files_;
};

}  // namespace ckpt
