// One error type for the whole library. Parsers throw ckpt::error; only cli/main.cpp catches
// it and maps its kind to an exit code, so every verb reports failures the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace ckpt {

enum class errc {
  check_failed,  // a requested check found a problem (exit 1)
  usage,         // bad flags or arguments (exit 2)
  corrupt,       // the input violates its format (exit 3)
  unsupported,   // a valid input ckptool does not handle (exit 3)
  unsafe,        // the input would run code if loaded by PyTorch (exit 3)
  limit,         // the input exceeds a configured resource limit (exit 3)
  io,            // reading or writing failed (exit 4)
  device,        // the requested device is missing or failed (exit 4)
};

/// The documented process exit code for an error kind (see man/ckptool.1): the one place
/// that maps failures to exit codes. constexpr, so signal handlers use it too.
constexpr int exit_code(errc kind) {
  switch (kind) {
    case errc::check_failed: return 1;
    case errc::usage: return 2;
    case errc::corrupt:
    case errc::unsupported:
    case errc::unsafe:
    case errc::limit: return 3;
    case errc::io:
    case errc::device: return 4;
  }
  return 3;
}
/// A short lower-case word for the kind, used in messages and JSON ("corrupt", "io", ...).
const char* errc_name(errc kind);

class error : public std::runtime_error {
 public:
  error(errc kind, std::string message, std::optional<uint64_t> offset = std::nullopt);

  errc kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const std::string& file() const { return file_; }
  std::optional<uint64_t> offset() const { return offset_; }

  /// Names the file the error is about, unless a deeper layer already did.
  error& with_file(const std::string& path);
  /// The same for an error raised in the coordinates of a part of `path` that starts at
  /// byte `base` (a slice): the offset becomes the file's own, so the message points at
  /// the byte to look at. Once a layer has named the file, deeper coordinates are final.
  error& with_file(const std::string& path, uint64_t base);

  /// "FILE: byte N: message" — the one line the CLI prints.
  std::string one_line() const;
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  void refresh();
  errc kind_;
  std::string message_;
  std::string file_;
  std::optional<uint64_t> offset_;
  std::string what_;
};

[[noreturn]] void throw_corrupt(std::string message, std::optional<uint64_t> offset = std::nullopt);
[[noreturn]] void throw_unsupported(std::string message,
                                    std::optional<uint64_t> offset = std::nullopt);
[[noreturn]] void throw_limit(std::string message, std::optional<uint64_t> offset = std::nullopt);

}  // namespace ckpt
