// Internal: writes JSON text piece by piece, laid out exactly as nlohmann::json's dump(2)
// (or, compact, dump()) lays out the same document, so a report with 100,000 tensors can be
// printed without first building (and then freeing) a tree of a million nodes. Object
// members must be given in the order nlohmann would print them: sorted by key, bytewise.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckpt::detail {

class json_writer {
 public:
  using sink = std::function<void(std::string_view)>;
  /// indent 2 lays out as dump(2); -1 writes no whitespace at all, as dump() does.
  explicit json_writer(sink out, int indent = 2);

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  /// The next member's key, inside an object.
  void key(std::string_view k);
  /// The same, for a key spelled in the source: printable ASCII without '"' or '\\' (every
  /// member name of the inspect document), so nothing is checked and the comma, newline,
  /// indentation, quoted name and ": " go to the buffer in one reservation. A report writes
  /// two million of them for a DCP directory of 80,000 chunks.
  template <size_t N>
  void key(const char (&k)[N]) {
    constexpr size_t n = N - 1;
    const size_t depth = counts_.size();
    if (2 * depth > kMaxIndent) return key(std::string_view(k, n));
    const size_t indent = compact_ ? 0 : 1 + 2 * depth;
    if (cap_ - len_ < n + indent + 5) make_room(n + indent + 5);
    char* p = buf_.get() + len_;
    if (counts_.back()++ > 0) *p++ = ',';
    std::memcpy(p, kIndent, indent);
    p += indent;
    *p++ = '"';
    std::memcpy(p, k, n);
    p += n;
    if (compact_) {
      std::memcpy(p, "\":", 2);
      p += 2;
    } else {
      std::memcpy(p, "\": ", 3);
      p += 3;
    }
    len_ = size_t(p - buf_.get());
    after_key_ = true;
  }
  void string(std::string_view s);
  void number(int64_t v);
  void number(uint64_t v);
  void boolean(bool v);
  /// An array of integers, as begin_array, number for each, end_array would write it; with
  /// pad_to, zeros follow up to that many elements.
  void ints(const int64_t* v, size_t n, size_t pad_to = 0);
  void null();
  /// A value built as a tree (small, irregular parts of a document), indented to fit here.
  void value(const nlohmann::json& v);
  /// Hands what is buffered to the sink; call once the document is complete.
  void flush();

 private:
  void open(char bracket);
  void close(char bracket);
  void before_value();
  void newline_indent(size_t depth);
  void quoted(std::string_view s);
  // A plain buffer: std::string's append checks and grows on every call, and a report
  // makes millions of them. Full, it goes to the sink.
  void put(const char* p, size_t n) {
    if (cap_ - len_ < n) make_room(n);
    std::memcpy(buf_.get() + len_, p, n);
    len_ += n;
  }
  void put(char c) {
    if (len_ == cap_) make_room(1);
    buf_[len_++] = c;
  }
  void make_room(size_t n);

  // A newline and the deepest indentation written in one piece; deeper levels are written
  // in pieces.
  static constexpr char kIndent[] =
      "\n                                                                ";
  static constexpr size_t kMaxIndent = sizeof kIndent - 2;

  sink out_;
  std::unique_ptr<char[]> buf_;
  size_t len_ = 0;
  size_t cap_ = 0;
  std::vector<size_t> counts_;  // members or elements written so far, per open container
  bool after_key_ = false;
  bool compact_ = false;
};

}  // namespace ckpt::detail
