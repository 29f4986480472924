#include "report/json_writer.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "ckpt/report.h"

namespace ckpt::detail {
namespace {

constexpr size_t kBufferSize = 1 << 16;

// Printable ASCII other than '"' and '\\' is written as is by every JSON serializer; any
// other byte (escapes, UTF-8, invalid UTF-8, WTF-8 surrogates) is left to json_text, so
// those strings come out exactly as the nlohmann serializer writes them.
inline __attribute__((always_inline)) bool plain_byte(unsigned char b) { return b >= 0x20 && b < 0x7f && b != '"' && b != '\\'; }

// The same test on eight bytes at once (the bit tricks of Anderson's "Bit Twiddling Hacks":
// haszero, hasless, hasmore), exact as a yes/no for the word: a report is mostly keys and
// names, tens of millions of bytes for a large set.
constexpr uint64_t kOnes = 0x0101010101010101ull, kHighs = 0x8080808080808080ull;
inline __attribute__((always_inline)) bool has_zero_byte(uint64_t w) { return ((w - kOnes) & ~w & kHighs) != 0; }
inline __attribute__((always_inline)) bool plain_word(uint64_t w) {
  const bool below_space = ((w - kOnes * 0x20) & ~w & kHighs) != 0;
  const bool above_tilde = (((w + kOnes * (0x7f - 0x7e)) | w) & kHighs) != 0;
  return !below_space && !above_tilde && !has_zero_byte(w ^ (kOnes * '"')) && !has_zero_byte(w ^ (kOnes * '\\'));
}

}  // namespace

json_writer::json_writer(sink out, int indent)
    : out_(std::move(out)), buf_(new char[kBufferSize]), cap_(kBufferSize), compact_(indent < 0) {}

void json_writer::make_room(size_t n) {
  flush();
  if (n > cap_) {
    buf_.reset(new char[n]);
    cap_ = n;
  }
}

void json_writer::newline_indent(size_t depth) {
  if (compact_) return;
  size_t spaces = 2 * depth;
  put(kIndent, 1 + std::min(spaces, kMaxIndent));
  for (spaces -= std::min(spaces, kMaxIndent); spaces > 0; spaces -= std::min(spaces, kMaxIndent))
    put(kIndent + 1, std::min(spaces, kMaxIndent));
}

void json_writer::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (counts_.empty()) return;  // the document itself
  if (counts_.back()++ > 0) put(',');
  newline_indent(counts_.size());
}

void json_writer::key(std::string_view k) {
  if (counts_.back()++ > 0) put(',');
  newline_indent(counts_.size());
  quoted(k);
  if (compact_)
    put(':');
  else
    put(": ", 2);
  after_key_ = true;
}

void json_writer::open(char bracket) {
  before_value();
  put(bracket);
  counts_.push_back(0);
}

void json_writer::close(char bracket) {
  const bool empty = counts_.back() == 0;
  counts_.pop_back();
  if (!empty) newline_indent(counts_.size());
  put(bracket);
}

void json_writer::quoted(std::string_view s) {
  // The common string is plain: checked and copied in the same pass over its words, into
  // the buffer directly (committed only if it was plain). A tail shorter than a word is
  // checked as the string's last eight bytes, overlapping what was checked already.
  const size_t n = s.size();
  if (cap_ - len_ < n + 2) make_room(n + 2);
  char* out = buf_.get() + len_ + 1;
  bool is_plain = true;
  if (n >= 8) {
    size_t i = 0;
    for (uint64_t w; i + 8 <= n; i += 8) {
      std::memcpy(&w, s.data() + i, 8);
      if (!plain_word(w)) {
        is_plain = false;
        break;
      }
      std::memcpy(out + i, &w, 8);
    }
    if (is_plain && i < n) {
      uint64_t w;
      std::memcpy(&w, s.data() + n - 8, 8);
      if (plain_word(w))
        std::memcpy(out + n - 8, &w, 8);
      else
        is_plain = false;
    }
  } else {
    for (size_t i = 0; is_plain && i < n; ++i) {
      if (!plain_byte(static_cast<unsigned char>(s[i]))) is_plain = false;
      out[i] = s[i];
    }
  }
  if (is_plain) {
    out[-1] = '"';
    out[n] = '"';
    len_ += n + 2;
  } else {
    const std::string text = json_text(nlohmann::json(std::string(s)), 0);
    put(text.data(), text.size());
  }
}

void json_writer::ints(const int64_t* v, size_t n, size_t pad_to) {
  const size_t total = std::max(n, pad_to);
  const size_t depth = counts_.size() + 1;
  if (2 * depth > kMaxIndent || total == 0) {
    begin_array();
    for (size_t i = 0; i < total; ++i) number(i < n ? v[i] : int64_t(0));
    end_array();
    return;
  }
  before_value();
  // Each element: a comma, the newline and indentation, at most 20 digits and a sign.
  const size_t indent = compact_ ? 0 : 1 + 2 * depth;
  const size_t need = 1 + total * (1 + indent + 21) + indent;
  if (cap_ - len_ < need) make_room(need);
  char* p = buf_.get() + len_;
  *p++ = '[';
  for (size_t i = 0; i < total; ++i) {
    if (i) *p++ = ',';
    std::memcpy(p, kIndent, indent);
    p += indent;
    p = std::to_chars(p, p + 21, i < n ? v[i] : int64_t(0)).ptr;
  }
  if (!compact_) {
    std::memcpy(p, kIndent, indent - 2);
    p += indent - 2;
  }
  *p++ = ']';
  len_ = size_t(p - buf_.get());
}

void json_writer::string(std::string_view s) {
  before_value();
  quoted(s);
}

void json_writer::number(int64_t v) {
  before_value();
  if (cap_ - len_ < 24) make_room(24);
  len_ = size_t(std::to_chars(buf_.get() + len_, buf_.get() + len_ + 24, v).ptr - buf_.get());
}

void json_writer::number(uint64_t v) {
  before_value();
  if (cap_ - len_ < 24) make_room(24);
  len_ = size_t(std::to_chars(buf_.get() + len_, buf_.get() + len_ + 24, v).ptr - buf_.get());
}

void json_writer::boolean(bool v) {
  before_value();
  if (v)
    put("true", 4);
  else
    put("false", 5);
}

void json_writer::null() {
  before_value();
  put("null", 4);
}

void json_writer::value(const nlohmann::json& v) {
  before_value();
  if (compact_) {
    const std::string text = json_text(v, -1);
    put(text.data(), text.size());
    return;
  }
  // JSON text has no raw newlines inside strings, so every newline starts a line to indent.
  const std::string text = json_text(v, 2);
  const size_t depth = counts_.size();
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    put(text.data() + start, nl - start);
    newline_indent(depth);
  }
  put(text.data() + start, text.size() - start);
}

void json_writer::flush() {
  if (len_ == 0) return;
  out_(std::string_view(buf_.get(), len_));
  len_ = 0;
}

}  // namespace ckpt::detail
