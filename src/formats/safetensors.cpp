// safetensors header validation (contract in ckpt/safetensors.h; rules S1-S8 in
// docs/security.md §2.C, formats.md §6). The JSON goes through nlohmann's SAX interface with
// a handler that enforces the schema as it parses: duplicate keys are caught at every level
// (a DOM parser would silently keep one of them), nothing deeper than the schema is ever
// built, and a 100 MB header never becomes a DOM.
#include "ckpt/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "base/byteio.h"
#include "ckpt/error.h"
#include "base/text.h"
#include "formats/safetensors_scan.h"

namespace ckpt::safetensors {
namespace {

constexpr uint64_t kPrefixSize = 8;
constexpr const char* kMetadataKey = "__metadata__";

using text::quote;

[[noreturn]] void corrupt(const std::string& msg, uint64_t offset = kPrefixSize) {
  throw_corrupt("safetensors: " + msg, offset);
}
[[noreturn]] void unsupported(const std::string& msg, uint64_t offset = kPrefixSize) {
  throw_unsupported("safetensors: " + msg, offset);
}
[[noreturn]] void limit(const std::string& msg, uint64_t offset = kPrefixSize) {
  throw_limit("safetensors: " + msg, offset);
}

using detail::raw_tensor;

constexpr unsigned kSeenDtype = 1, kSeenShape = 2, kSeenOffsets = 4;

// Schema-enforcing SAX handler: top object -> {name: tensor object, "__metadata__": object of
// strings}; tensor object -> exactly dtype (string), shape (array of unsigned), data_offsets
// (array of two unsigned). Any deviation throws at once.
class schema_handler {
 public:
  using json = nlohmann::json;
  schema_handler(const limits& lim, header& out) : lim_(lim), out_(out) {}

  std::vector<raw_tensor> tensors;

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (state_ == state::array_items)
      corrupt(array_field() + " of tensor " + quote(tensors.back().name) + " has negative value " +
              std::to_string(v));
    return scalar("a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (state_ != state::array_items) return scalar("a number");
    raw_tensor& t = tensors.back();
    if (array_ == field::shape) {
      if (t.shape.size() >= lim_.max_rank)
        limit("tensor " + quote(t.name) + " has more than " + std::to_string(lim_.max_rank) +
              " dimensions");
      t.shape.push_back(v);
    } else {
      if (t.offset_count >= 2) corrupt("data_offsets of tensor " + quote(t.name) + " has more than two values");
      t.offsets[t.offset_count++] = v;
    }
    return true;
  }
  bool number_float(json::number_float_t, const std::string& text) {
    if (state_ == state::array_items)
      corrupt(array_field() + " of tensor " + quote(tensors.back().name) + " has value " + text +
              ", not a non-negative integer");
    return scalar("a number");
  }
  bool string(std::string& v) {
    if (state_ == state::metadata_value) {
      out_.metadata.emplace_back(std::move(pending_key_), std::move(v));
      state_ = state::metadata_key;
      return true;
    }
    if (state_ == state::tensor_value && field_ == field::dtype) {
      tensors.back().dtype = std::move(v);
      state_ = state::tensor_key;
      return true;
    }
    return scalar("a string");
  }
  bool binary(json::binary_t&) { return scalar("binary data"); }

  bool start_object(std::size_t) {
    switch (state_) {
      case state::start:
        state_ = state::top_key;
        return true;
      case state::top_value:
        if (is_metadata_) {
          state_ = state::metadata_key;
        } else {
          state_ = state::tensor_key;
        }
        return true;
      default:
        return scalar("an object");
    }
  }

  bool key(std::string& k) {
    switch (state_) {
      case state::top_key: {
        if (!top_keys_.insert(k).second) corrupt("duplicate key " + quote(k));
        is_metadata_ = k == kMetadataKey;
        if (!is_metadata_) {
          if (tensors.size() >= lim_.max_tensors)
            limit("more than " + std::to_string(lim_.max_tensors) + " tensors (raise with --max-tensors)");
          if (k.size() > lim_.max_name_length)
            limit("tensor name of " + std::to_string(k.size()) + " bytes is longer than " +
                  std::to_string(lim_.max_name_length));
          tensors.emplace_back();
          tensors.back().name = std::move(k);
        }
        state_ = state::top_value;
        return true;
      }
      case state::metadata_key:
        if (!metadata_keys_.insert(k).second) corrupt("duplicate __metadata__ key " + quote(k));
        pending_key_ = std::move(k);
        state_ = state::metadata_value;
        return true;
      case state::tensor_key: {
        raw_tensor& t = tensors.back();
        unsigned bit;
        if (k == "dtype") {
          field_ = field::dtype;
          bit = kSeenDtype;
        } else if (k == "shape") {
          field_ = field::shape;
          bit = kSeenShape;
        } else if (k == "data_offsets") {
          field_ = field::offsets;
          bit = kSeenOffsets;
        } else {
          // safetensors (serde, without deny_unknown_fields) reads past it; a later writer's
          // field could change what the bytes mean, so it is not read without: unsupported.
          unsupported("tensor " + quote(t.name) + " has a field this reader does not know, " + quote(k) +
                      " (safetensors ignores it; ckptool does not guess what it means)");
        }
        if (t.seen & bit) corrupt("tensor " + quote(t.name) + " has duplicate field " + quote(k));
        t.seen |= bit;
        state_ = state::tensor_value;
        return true;
      }
      default:
        corrupt("unexpected key " + quote(k));
    }
  }

  bool end_object() {
    switch (state_) {
      case state::top_key:
        state_ = state::done;
        return true;
      case state::metadata_key:
        state_ = state::top_key;
        return true;
      case state::tensor_key: {
        const raw_tensor& t = tensors.back();
        if (!(t.seen & kSeenDtype)) corrupt("tensor " + quote(t.name) + " has no dtype");
        if (!(t.seen & kSeenShape)) corrupt("tensor " + quote(t.name) + " has no shape");
        if (!(t.seen & kSeenOffsets)) corrupt("tensor " + quote(t.name) + " has no data_offsets");
        state_ = state::top_key;
        return true;
      }
      default:
        corrupt("unexpected end of object");
    }
  }

  bool start_array(std::size_t) {
    if (state_ == state::tensor_value && (field_ == field::shape || field_ == field::offsets)) {
      array_ = field_;
      state_ = state::array_items;
      return true;
    }
    return scalar("an array");
  }

  bool end_array() {
    if (state_ != state::array_items) corrupt("unexpected end of array");
    const raw_tensor& t = tensors.back();
    if (array_ == field::offsets && t.offset_count != 2)
      corrupt("data_offsets of tensor " + quote(t.name) + " has " + std::to_string(t.offset_count) +
              " values, not two");
    state_ = state::tensor_key;
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    // nlohmann counts characters read, so the offending byte is the one before `position`.
    uint64_t at = kPrefixSize + (position > 0 ? position - 1 : 0);
    std::string what = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
    size_t colon = what.find(": ");
    corrupt("header is not valid JSON: " + (colon == std::string::npos ? what : what.substr(colon + 2)),
            at);
  }

  bool finished() const { return state_ == state::done; }

 private:
  enum class state {
    start, top_key, top_value, metadata_key, metadata_value, tensor_key, tensor_value,
    array_items, done
  };
  enum class field { dtype, shape, offsets };

  std::string array_field() const { return array_ == field::shape ? "shape" : "data_offsets"; }

  // A value of the wrong JSON type for where it stands.
  [[noreturn]] bool scalar(const char* what) {
    switch (state_) {
      case state::start:
        corrupt(std::string("header is ") + what + ", not a JSON object");
      case state::top_value:
        if (is_metadata_) corrupt(std::string("__metadata__ is ") + what + ", not an object");
        corrupt("tensor " + quote(tensors.back().name) + " is " + what + ", not an object");
      case state::metadata_value:
        corrupt("__metadata__ value for " + quote(pending_key_) + " is " + what + ", not a string");
      case state::tensor_value: {
        const char* want = field_ == field::dtype ? "a string" : "an array";
        const char* name = field_ == field::dtype ? "dtype" : field_ == field::shape ? "shape" : "data_offsets";
        corrupt(std::string(name) + " of tensor " + quote(tensors.back().name) + " is " + what +
                ", not " + want);
      }
      case state::array_items:
        corrupt(array_field() + " of tensor " + quote(tensors.back().name) + " contains " + what);
      default:
        corrupt(std::string("unexpected ") + what + " in header");
    }
  }

  const limits& lim_;
  header& out_;
  state state_ = state::start;
  field field_ = field::dtype;
  field array_ = field::shape;
  bool is_metadata_ = false;
  std::string pending_key_;
  std::unordered_set<std::string> top_keys_;
  std::unordered_set<std::string> metadata_keys_;
};


}  // namespace

namespace detail {

void parse_header_json(std::string_view text, const limits& lim, std::vector<raw_tensor>& tensors,
                       std::vector<std::pair<std::string, std::string>>& metadata) {
  header h;
  schema_handler handler(lim, h);
  nlohmann::json::sax_parse(text.begin(), text.end(), &handler, nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  if (!handler.finished()) corrupt("header JSON is incomplete");
  tensors = std::move(handler.tensors);
  metadata = std::move(h.metadata);
}

}  // namespace detail

bool looks_like_safetensors(const uint8_t* first, size_t n, uint64_t file_size) {
  if (n < kPrefixSize + 1 || file_size < kPrefixSize) return false;
  const uint64_t len = load_u64(first);
  if (len < 2) return false;
  // A JSON object right after the length marks the file as safetensors even when the length
  // itself is impossible: read_header then names the bad length instead of the file being
  // called unrecognized.
  const bool length_fits = len <= kMaxHeaderSize && len <= file_size - kPrefixSize;
  const size_t end = length_fits ? size_t(std::min<uint64_t>(n, kPrefixSize + len)) : n;
  for (size_t i = kPrefixSize; i < end; ++i) {
    const uint8_t c = first[i];
    if (c == '{') return true;
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return false;
  }
  return length_fits;  // only whitespace so far: the full parse decides
}

header read_header(const byte_source& src, const limits& lim) {
  try {
    const uint64_t size = src.size();
    if (size < kPrefixSize)
      corrupt("file has " + std::to_string(size) + " bytes, too few for the header length", 0);
    uint8_t prefix[kPrefixSize];
    src.read_exact(0, prefix, kPrefixSize);
    header h;
    h.header_size = load_u64(prefix);
    if (h.header_size > kMaxHeaderSize)
      corrupt("header length " + std::to_string(h.header_size) + " exceeds the format's maximum of " +
                  std::to_string(kMaxHeaderSize),
              0);
    if (h.header_size > size - kPrefixSize)
      corrupt("header length " + std::to_string(h.header_size) + " runs past the end of the file (" +
                  std::to_string(size) + " bytes)",
              0);
    h.data_start = kPrefixSize + h.header_size;
    const std::vector<uint8_t> text = src.read_vector(kPrefixSize, size_t(h.header_size));
    // nlohmann skips a leading UTF-8 BOM; serde_json, the reference parser, does not.
    if (text.size() >= 3 && text[0] == 0xEF && text[1] == 0xBB && text[2] == 0xBF)
      corrupt("header starts with a UTF-8 byte order mark");

    // nlohmann reads a NUL byte as the end of its input, so "{}\0junk" would pass; JSON
    // never holds a raw NUL, and serde_json rejects one.
    if (const void* nul = text.empty() ? nullptr : std::memchr(text.data(), 0, text.size()))
      corrupt("header contains a NUL byte",
              kPrefixSize + uint64_t(static_cast<const uint8_t*>(nul) - text.data()));

    // The writers' headers, read by the scanner (§6.2); any other, and any the scanner
    // doubts, by the schema-checking JSON parser, which alone reports what is wrong.
    std::vector<raw_tensor> tensors;
    const std::string_view json(reinterpret_cast<const char*>(text.data()), text.size());
    if (!detail::scan_header(json, {lim.max_tensors, lim.max_name_length, lim.max_rank}, tensors, h.metadata)) {
      tensors.clear();
      h.metadata.clear();
      detail::parse_header_json(json, lim, tensors, h.metadata);
    }

    // Sizes first, in JSON order, so the first bad tensor is the one named.
    std::vector<uint64_t> nbytes(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const raw_tensor& t = tensors[i];
      const safetensors_dtype* d = safetensors_dtype_named(t.dtype);
      if (!d) corrupt("tensor " + quote(t.name) + " has unknown dtype " + quote(t.dtype));
      uint64_t elements = 1, bits;
      for (uint64_t dim : t.shape)
        if (!checked_mul(elements, dim, &elements))
          corrupt("shape " + text::shape(t.shape) + " of tensor " + quote(t.name) + " overflows");
      if (!checked_mul(elements, d->bits, &bits))
        corrupt("size of tensor " + quote(t.name) + " (" + t.dtype + " " + text::shape(t.shape) +
                ") overflows");
      if (bits % 8 != 0)
        corrupt("tensor " + quote(t.name) + " (" + t.dtype + " " + text::shape(t.shape) +
                ") does not fill whole bytes");
      nbytes[i] = bits / 8;
      const uint64_t begin = t.offsets[0], end = t.offsets[1];
      if (begin > end)
        corrupt("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] of tensor " +
                quote(t.name) + " end before they begin");
      if (end - begin != nbytes[i])
        corrupt("tensor " + quote(t.name) + " spans " + std::to_string(end - begin) + " bytes but " +
                t.dtype + " " + text::shape(t.shape) + " needs " + std::to_string(nbytes[i]));
    }

    // Sorted by offset, the tensors must tile the data buffer exactly: no gap, no overlap,
    // nothing after the last one (no room for a polyglot tail).
    std::vector<size_t> order(tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const auto& x = tensors[a].offsets;
      const auto& y = tensors[b].offsets;
      return x[0] != y[0] ? x[0] < y[0] : x[1] != y[1] ? x[1] < y[1] : a < b;
    });
    uint64_t expected = 0;
    for (size_t i : order) {
      const raw_tensor& t = tensors[i];
      if (t.offsets[0] < expected)
        corrupt("tensor " + quote(t.name) + " at data offset " + std::to_string(t.offsets[0]) +
                " overlaps the previous tensor, which ends at " + std::to_string(expected));
      if (t.offsets[0] > expected)
        corrupt(std::to_string(t.offsets[0] - expected) + " unused bytes before tensor " +
                quote(t.name) + " at data offset " + std::to_string(expected));
      expected = t.offsets[1];
    }
    uint64_t data_end = 0;
    const bool fits = checked_add(h.data_start, expected, &data_end);
    if (!fits || data_end != size) {
      if (fits && data_end < size)
        corrupt(std::to_string(size - data_end) + " bytes after the last tensor", data_end);
      corrupt("tensors need " + std::to_string(expected) + " data bytes but the file has " +
                  std::to_string(size - h.data_start),
              size);
    }

    // Valid safetensors from here on; what is left is whether torch can hold it.
    h.tensors.reserve(tensors.size());
    for (raw_tensor& t : tensors) {
      const safetensors_dtype* d = safetensors_dtype_named(t.dtype);
      if (!d->torch) unsupported("tensor " + quote(t.name) + " has dtype " + t.dtype + ", which torch lacks");
      tensor_entry e;
      e.name = std::move(t.name);
      e.type = *d->torch;
      e.begin = t.offsets[0];
      e.end = t.offsets[1];
      e.file_offset = h.data_start + e.begin;
      for (uint64_t dim : t.shape) {
        if (dim > uint64_t(std::numeric_limits<int64_t>::max()))
          unsupported("tensor " + quote(e.name) + " has dimension " + std::to_string(dim) +
                      ", too large for torch");
        e.shape.push_back(int64_t(dim));
      }
      // torch packs two F4 values per float4_e2m1fn_x2 element along the last dimension.
      if (e.type == dtype::float4_e2m1fn_x2) {
        if (e.shape.empty() || e.shape.back() % 2 != 0)
          unsupported("F4 tensor " + quote(e.name) + " with shape " + text::shape(t.shape) +
                      " cannot be packed in pairs along its last dimension");
        e.shape.back() /= 2;
      }
      h.tensors.push_back(std::move(e));
    }
    return h;
  } catch (error& e) {
    src.locate(e);
    throw;
  }
}

}  // namespace ckpt::safetensors
