#include "ckpt/error.h"

#include "base/text_escape.h"

namespace ckpt {

const char* errc_name(errc kind) {
  switch (kind) {
    case errc::check_failed: return "check-failed";
    case errc::usage: return "usage";
    case errc::corrupt: return "corrupt";
    case errc::unsupported: return "unsupported";
    case errc::unsafe: return "unsafe";
    case errc::limit: return "limit";
    case errc::io: return "io";
    case errc::device: return "device";
  }
  return "error";
}

error::error(errc kind, std::string message, std::optional<uint64_t> offset)
    : std::runtime_error(message), kind_(kind), message_(std::move(message)), offset_(offset) {
  refresh();
}

error& error::with_file(const std::string& path) {
  if (file_.empty()) file_ = path;
  refresh();
  return *this;
}

error& error::with_file(const std::string& path, uint64_t base) {
  if (file_.empty() && offset_) {
    uint64_t absolute;
    // A slice lies inside its file, so this cannot overflow unless the offset is already
    // nonsense; then the relative one is the more useful of the two.
    if (!__builtin_add_overflow(*offset_, base, &absolute)) offset_ = absolute;
  }
  return with_file(path);
}

std::string error::one_line() const { return what_; }

void error::refresh() {
  std::string line;
  if (!file_.empty()) line += file_ + ": ";
  if (offset_) line += "byte " + std::to_string(*offset_) + ": ";
  line += message_;
  // One line, always, and nothing a terminal acts on: a hostile file name or pickle string
  // must not forge extra lines or erase this one.
  what_ = escape_controls(line);
}


[[noreturn]] void throw_corrupt(std::string message, std::optional<uint64_t> offset) {
  throw error(errc::corrupt, std::move(message), offset);
}
[[noreturn]] void throw_unsupported(std::string message, std::optional<uint64_t> offset) {
  throw error(errc::unsupported, std::move(message), offset);
}
[[noreturn]] void throw_limit(std::string message, std::optional<uint64_t> offset) {
  throw error(errc::limit, std::move(message), offset);
}

}  // namespace ckpt
