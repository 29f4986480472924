// The rows of a text table, padded by hand into one buffer: what `out << std::setw(w) <<
// field` prints, without a stream sentry and a width reset per field. A table of 20,000
// keys is 100,000 fields; through the stream they cost as much as reading the checkpoint.
#pragma once

#include <charconv>
#include <ostream>
#include <string>
#include <string_view>

namespace cli {

/// "[419, 64]", as ckpt::text::shape prints a shape (a negative dimension, a nested
/// tensor's varying one, as "?"), from a dim_list without converting it to a vector.
template <class Dims>
std::string shape_text(const Dims& dims) {
  std::string out;
  out.reserve(2 + 8 * dims.size());
  out += '[';
  char digits[24];
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out.append(", ", 2);
    if (dims[i] < 0)
      out += '?';
    else
      out.append(digits, std::to_chars(digits, digits + sizeof digits, dims[i]).ptr);
  }
  out += ']';
  return out;
}

class table_lines {
 public:
  explicit table_lines(std::ostream& out) : out_(out) { buf_.reserve(kFlushAt + 4096); }
  table_lines(const table_lines&) = delete;
  table_lines& operator=(const table_lines&) = delete;
  ~table_lines() { flush(); }

  table_lines& text(std::string_view s) {
    buf_.append(s);
    return *this;
  }
  /// std::left << std::setw(w) << s: padded after, never cut.
  table_lines& left(std::string_view s, size_t w) {
    buf_.append(s);
    if (s.size() < w) buf_.append(w - s.size(), ' ');
    return *this;
  }
  /// std::right << std::setw(w) << s: padded before, never cut.
  table_lines& right(std::string_view s, size_t w) {
    if (s.size() < w) buf_.append(w - s.size(), ' ');
    buf_.append(s);
    return *this;
  }
  /// Ends a line; the buffer goes out when it is large.
  void end_line() {
    buf_ += '\n';
    if (buf_.size() >= kFlushAt) flush();
  }
  void flush() {
    if (buf_.empty()) return;
    out_.write(buf_.data(), std::streamsize(buf_.size()));
    buf_.clear();
  }

 private:
  static constexpr size_t kFlushAt = 1 << 16;
  std::ostream& out_;
  std::string buf_;
};

}  // namespace cli
