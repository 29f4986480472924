// Internal: writes JSON text piece by piece, laid out exactly as nlohmann::json's dump(2)
// (or, compact, dump()) lays out the same document, so a report with 100,000 tensors can be
// printed without first building (and then freeing) a tree of a million nodes. Object
// members must be given in the order nlohmann would print them: sorted by key, bytewise.
#pragma once

#include <cstdint>
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
  void string(std::string_view s);
  void number(int64_t v);
  void number(uint64_t v);
  void boolean(bool v);
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

  sink out_;
  std::unique_ptr<char[]> buf_;
  size_t len_ = 0;
  size_t cap_ = 0;
  std::vector<size_t> counts_;  // members or elements written so far, per open container
  bool after_key_ = false;
  bool compact_ = false;
};

}  // namespace ckpt::detail
