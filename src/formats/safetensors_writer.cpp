#include "formats/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "base/text.h"
#include "ckpt/error.h"
#include "ckpt/sys_io.h"
#include "pickle/pickle_text.h"

namespace ckpt::safetensors {
namespace {

struct writable {
  dtype type;
  const char* name;
};

// In the order of safetensors' `Dtype` enum (tensor.rs), whose derived Ord the reference
// sorts by, descending, before the names: the row index is the rank (formats.md §6.1).
constexpr writable kWritable[] = {
    {dtype::boolean, "BOOL"},          {dtype::float4_e2m1fn_x2, "F4"},
    {dtype::uint8, "U8"},              {dtype::int8, "I8"},
    {dtype::float8_e5m2, "F8_E5M2"},   {dtype::float8_e4m3fn, "F8_E4M3"},
    {dtype::float8_e8m0fnu, "F8_E8M0"}, {dtype::float8_e4m3fnuz, "F8_E4M3FNUZ"},
    {dtype::float8_e5m2fnuz, "F8_E5M2FNUZ"}, {dtype::int16, "I16"},
    {dtype::uint16, "U16"},            {dtype::float16, "F16"},
    {dtype::bfloat16, "BF16"},         {dtype::int32, "I32"},
    {dtype::uint32, "U32"},            {dtype::float32, "F32"},
    {dtype::complex64, "C64"},         {dtype::float64, "F64"},
    {dtype::int64, "I64"},             {dtype::uint64, "U64"},
};

int rank(dtype t) {
  for (size_t i = 0; i < std::size(kWritable); ++i)
    if (kWritable[i].type == t) return int(i);
  return -1;
}

// serde_json's compact string form: `"` and `\` escaped, \b \f \n \r \t short, other
// controls as \u00xx (lower-case hex); everything else, DEL and non-ASCII included, as is.
void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void check_text(const std::string& s, const char* what) {
  if (!pickle::detail::valid_utf8(s, false))
    throw_unsupported(std::string(what) + " " + text::quote(s) + " is not UTF-8: safetensors cannot hold it");
}

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& name) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw_unsupported("tensor " + text::quote(name) + ": size overflows");
  return r;
}

}  // namespace

const char* writable_dtype_name(dtype t) {
  const int r = rank(t);
  return r < 0 ? nullptr : kWritable[r].name;
}

file_layout plan(const std::vector<tensor_spec>& tensors, const std::optional<metadata_map>& metadata,
                 const limits& lim) {
  if (tensors.size() > lim.max_tensors)
    throw_limit(std::to_string(tensors.size()) + " tensors; the limit is " + std::to_string(lim.max_tensors));
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.name.empty()) throw_unsupported("a tensor has an empty name");
    if (t.name.size() > lim.max_name_length)
      throw_limit("tensor name of " + std::to_string(t.name.size()) + " bytes; the limit is " +
                  std::to_string(lim.max_name_length));
    check_text(t.name, "tensor name");
    // The reference writes such a tensor where the metadata goes: no reader can read it.
    if (t.name == "__metadata__") throw_unsupported("a tensor named '__metadata__' cannot be saved as safetensors");
    if (!names.insert(t.name).second) throw_unsupported("tensor name " + text::quote(t.name) + " given twice");
    if (rank(t.type) < 0)
      throw_unsupported("tensor " + text::quote(t.name) + ": safetensors has no dtype " + name(t.type));
    if (t.shape.size() > lim.max_rank)
      throw_limit("tensor " + text::quote(t.name) + " has " + std::to_string(t.shape.size()) +
                  " dimensions; the limit is " + std::to_string(lim.max_rank));
    if (t.type == dtype::float4_e2m1fn_x2 && t.shape.empty())
      throw_unsupported("tensor " + text::quote(t.name) + ": a 0-dim float4_e2m1fn_x2 has no safetensors shape");
    uint64_t bytes = element_size(t.type);
    for (int64_t d : t.shape) {
      if (d < 0) throw_unsupported("tensor " + text::quote(t.name) + " has a negative dimension");
      bytes = checked_mul(bytes, uint64_t(d), t.name);
    }
    if (t.type == dtype::float4_e2m1fn_x2) checked_mul(uint64_t(t.shape.back()), 2, t.name);
    if (bytes != t.nbytes)
      throw_unsupported("tensor " + text::quote(t.name) + ": " + std::to_string(t.nbytes) + " bytes given, its shape " +
                        text::shape(t.shape) + " of " + name(t.type) + " holds " + std::to_string(bytes));
  }
  if (metadata) {
    std::unordered_set<std::string_view> keys;
    for (const auto& [k, v] : *metadata) {
      check_text(k, "metadata key");
      check_text(v, "metadata value");
      if (!keys.insert(k).second) throw_unsupported("metadata key " + text::quote(k) + " given twice");
    }
  }

  file_layout out;
  out.order.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) out.order[i] = i;
  // tensor.rs `prepare`: descending dtype, then name (Rust's str order: bytewise).
  std::sort(out.order.begin(), out.order.end(), [&](size_t a, size_t b) {
    const int ra = rank(tensors[a].type), rb = rank(tensors[b].type);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;
  });

  std::string json = "{";
  if (metadata) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : *metadata) {
      if (!first) json += ',';
      first = false;
      append_json_string(json, k);
      json += ':';
      append_json_string(json, v);
    }
    json += '}';
  }
  out.begin.resize(tensors.size());
  uint64_t offset = 0;
  for (size_t i : out.order) {
    const auto& t = tensors[i];
    if (json.size() > 1) json += ',';
    append_json_string(json, t.name);
    json += ":{\"dtype\":\"";
    json += kWritable[rank(t.type)].name;
    json += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d) json += ',';
      // F4's header counts 4-bit elements: torch's packed last dimension, doubled.
      const bool last_f4 = t.type == dtype::float4_e2m1fn_x2 && d + 1 == t.shape.size();
      json += std::to_string(uint64_t(t.shape[d]) * (last_f4 ? 2 : 1));
    }
    out.begin[i] = offset;
    if (__builtin_add_overflow(offset, t.nbytes, &offset)) throw_unsupported("the tensors' total size overflows");
    json += "],\"data_offsets\":[" + std::to_string(out.begin[i]) + ',' + std::to_string(offset) + "]}";
    if (json.size() > kMaxHeaderSize)
      throw_limit("the safetensors header passes " + std::to_string(kMaxHeaderSize) + " bytes");
  }
  json += '}';
  // tensor.rs `prepare`: spaces up to a multiple of 8, so the data starts 8-aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxHeaderSize)
    throw_limit("the safetensors header passes " + std::to_string(kMaxHeaderSize) + " bytes");
  out.header.resize(8);
  uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out.header[b] = char((n >> (8 * b)) & 0xff);
  out.header += json;
  out.data_size = offset;
  return out;
}

void tensor_sink::write(const void* buf, size_t n) {
  if (n > expected_ - written_)
    throw error(errc::corrupt, "tensor " + text::quote(*name_) + ": more than its " + std::to_string(expected_) +
                                   " bytes supplied");
  out_.write(buf, n);
  written_ += n;
}

void tensor_sink::copy(int fd, const std::string& name, uint64_t offset, uint64_t n) {
  if (n > expected_ - written_)
    throw error(errc::corrupt, "tensor " + text::quote(*name_) + ": more than its " + std::to_string(expected_) +
                                   " bytes supplied");
  copy_range(fd, name, offset, n, out_.fd(), out_.path());
  written_ += n;
}

void write(output_file& out, const file_layout& layout, const std::vector<tensor_spec>& tensors,
           const std::function<void(size_t index, tensor_sink& sink)>& supply) {
  out.write(layout.header.data(), layout.header.size());
  uint64_t done = layout.header.size();
  for (size_t i : layout.order) {
    tensor_sink sink(out);
    sink.expected_ = tensors[i].nbytes;
    sink.name_ = &tensors[i].name;
    supply(i, sink);
    if (sink.written_ != sink.expected_)
      throw error(errc::corrupt, "tensor " + text::quote(tensors[i].name) + ": " + std::to_string(sink.written_) +
                                     " of its " + std::to_string(sink.expected_) + " bytes supplied");
    done += sink.written_;
    out.start_writeback(done);
  }
}

}  // namespace ckpt::safetensors
