// The common-case scanner of safetensors headers (docs/formats.md §6.2). It never reports
// an error: whatever it does not read exactly (escapes, non-ASCII, negative or fractional
// numbers, a duplicate or missing field, a limit reached, bad JSON) makes it return false,
// and read_header hands the header to the full parser, whose checks and messages stay the
// only ones a user sees.
#include "formats/safetensors_scan.h"

#include <algorithm>
#include <unordered_set>

#include "base/string_index.h"

namespace ckpt::safetensors::detail {
namespace {

class scanner {
 public:
  scanner(std::string_view text, const scan_limits& lim) : p_(text.data()), end_(text.data() + text.size()), lim_(lim) {}

  bool run(std::vector<raw_tensor>& tensors, std::vector<std::pair<std::string, std::string>>& metadata) {
    skip_ws();
    if (!eat('{')) return false;
    skip_ws();
    bool saw_metadata = false;
    if (!eat('}')) {
      for (;;) {
        std::string_view name;
        if (!string(name) || !colon()) return false;
        if (name == "__metadata__") {
          if (saw_metadata || !metadata_object(metadata)) return false;
          saw_metadata = true;
        } else {
          if (tensors.size() >= lim_.max_tensors || name.size() > lim_.max_name_length) return false;
          tensors.emplace_back();
          if (!tensor_object(name, tensors.back())) return false;
        }
        skip_ws();
        if (eat('}')) break;
        if (!eat(',')) return false;
        skip_ws();
      }
    }
    skip_ws();
    if (p_ != end_) return false;
    // Duplicate tensor names: one open-addressing pass once the names are known.
    ckpt::detail::string_index seen(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i)
      if (seen.insert(i, [&](size_t k) { return std::string_view(tensors[k].name); }) != seen.npos) return false;
    return true;
  }

 private:
  static bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  void skip_ws() {
    while (p_ != end_ && ws(*p_)) ++p_;
  }
  bool eat(char c) {
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  bool colon() {
    skip_ws();
    if (!eat(':')) return false;
    skip_ws();
    return true;
  }

  // A string of printable ASCII other than '"' and '\\': its bytes are its value.
  bool string(std::string_view& out) {
    if (!eat('"')) return false;
    const char* start = p_;
    for (; p_ != end_; ++p_) {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        out = std::string_view(start, size_t(p_ - start));
        ++p_;
        return true;
      }
      if (c < 0x20 || c >= 0x7f || c == '\\') return false;
    }
    return false;
  }

  // 0, or 1 to 19 digits without a leading zero: always within uint64_t, and followed by
  // something that ends a JSON number here (not '.', 'e' or another digit).
  bool number(uint64_t& out) {
    const char* start = p_;
    uint64_t v = 0;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') v = v * 10 + uint64_t(*p_++ - '0');
    const size_t n = size_t(p_ - start);
    if (n == 0 || n > 19 || (n > 1 && *start == '0')) return false;
    if (p_ == end_ || !(ws(*p_) || *p_ == ',' || *p_ == ']')) return false;
    out = v;
    return true;
  }

  // [n, n, ...], at most `max` values, appended through put.
  template <class Put>
  bool numbers(uint64_t max, Put put) {
    if (!eat('[')) return false;
    skip_ws();
    if (eat(']')) return true;
    for (uint64_t count = 0;; ++count) {
      uint64_t v;
      if (count >= max || !number(v)) return false;
      put(v);
      skip_ws();
      if (eat(']')) return true;
      if (!eat(',')) return false;
      skip_ws();
    }
  }

  bool tensor_object(std::string_view name, raw_tensor& t) {
    if (!eat('{')) return false;
    t.name.assign(name.data(), name.size());
    skip_ws();
    for (;;) {
      std::string_view field;
      if (!string(field) || !colon()) return false;
      if (field == "dtype") {
        std::string_view dt;
        if ((t.seen & 1) || !string(dt)) return false;
        t.dtype.assign(dt.data(), dt.size());
        t.seen |= 1;
      } else if (field == "shape") {
        if ((t.seen & 2) || !numbers(lim_.max_rank, [&](uint64_t v) { t.shape.push_back(v); })) return false;
        t.seen |= 2;
      } else if (field == "data_offsets") {
        if ((t.seen & 4) || !numbers(2, [&](uint64_t v) { t.offsets[t.offset_count++] = v; })) return false;
        if (t.offset_count != 2) return false;
        t.seen |= 4;
      } else {
        return false;
      }
      skip_ws();
      if (eat('}')) return t.seen == 7;
      if (!eat(',')) return false;
      skip_ws();
    }
  }

  bool metadata_object(std::vector<std::pair<std::string, std::string>>& out) {
    if (!eat('{')) return false;
    skip_ws();
    if (eat('}')) return true;
    std::unordered_set<std::string_view> keys;
    for (;;) {
      std::string_view k, v;
      if (!string(k) || !colon() || !string(v) || !keys.insert(k).second) return false;
      out.emplace_back(std::string(k), std::string(v));
      skip_ws();
      if (eat('}')) return true;
      if (!eat(',')) return false;
      skip_ws();
    }
  }

  const char* p_;
  const char* end_;
  const scan_limits& lim_;
};

}  // namespace

bool scan_header(std::string_view text, const scan_limits& lim, std::vector<raw_tensor>& tensors,
                 std::vector<std::pair<std::string, std::string>>& metadata) {
  // A writer's tensor takes 60 bytes of header or more: reserved for that many (up to a
  // bound, so that a header of padding reserves little), the table is not copied as it grows.
  tensors.reserve(std::min<size_t>({text.size() / 64 + 1, size_t(1) << 16, size_t(lim.max_tensors)}));
  return scanner(text, lim).run(tensors, metadata);
}

}  // namespace ckpt::safetensors::detail
