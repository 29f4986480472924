#include "diff/key_reader.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "base/byte_order.h"
#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

// The first byte of run r of a box that is not contiguous (assembly.h's mixed radix).
uint64_t run_start(const box_landing& b, uint64_t r) {
  uint64_t at = b.offset;
  for (size_t k = b.counts.size(); k-- > 0;) {
    at += (r % b.counts[k]) * b.pitches[k];
    r /= b.counts[k];
  }
  return at;
}

// The first run in [0, runs) for which `past(start)` holds; runs lie in ascending order.
template <class F>
uint64_t first_run(const box_landing& b, uint64_t runs, F past) {
  uint64_t lo = 0, hi = runs;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (past(run_start(b, mid)))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

}  // namespace

key_reader::key_reader(const checkpoint& c, std::string name, size_t tensor) : name_(std::move(name)) {
  const tensor_record& t = c.tensors.at(tensor);
  type_ = t.type;
  const std::string what = "key '" + name_ + "'";
  if (t.composite() || t.kind)
    throw_unsupported(what + " is a " + (t.kind ? t.kind->description() : std::string("composite")) +
                      " tensor: diff does not compare its values");
  if (t.quant) throw_unsupported(what + " is a quantized tensor: diff does not compare its values");
  nbytes_ = t.nbytes();
  if (!t.storage || *t.storage >= c.storages.size() || !c.storages[*t.storage].file_offset) {
    has_data_ = false;  // a meta tensor
    return;
  }
  const storage_record& s = c.storages[*t.storage];
  const source_file& f = c.files.at(s.file);
  if (c.byteorder == "big") {
    // torch.load swaps by the storage's type; a tensor of a narrower one would split groups.
    swap_width_ = byteswap_width(s.type);
    if (swap_width_ > 1 && element_size(type_) % swap_width_ != 0)
      throw error(errc::unsupported, what + ": a " + ckpt::name(type_) + " view of big-endian " + ckpt::name(s.type) +
                                         " data: diff does not compare its values")
          .with_file(f.path);
  }
  // The bytes of an archive that holds the data are not the data (read_plan.cpp refuses
  // them for the same reason).
  if (s.archive_range) throw error(errc::unsupported, what + ": its chunk archive was not opened").with_file(f.path);
  file_ = f.source.get();
  if (nbytes_ == 0) {
    kind_ = source_kind::contiguous;
    return;
  }
  const uint64_t element = element_size(type_);
  if (t.stride.size() != t.shape.size() || t.storage_offset < 0)
    throw error(errc::corrupt, what + ": its strides do not match its shape").with_file(f.path);
  // The view's highest element, and whether it is the row-major layout of its shape.
  uint64_t last = uint64_t(t.storage_offset);
  bool row_major = true;
  int64_t expect = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    const int64_t n = t.shape[d], st = t.stride[d];
    if (st < 0) throw error(errc::corrupt, what + ": a negative stride").with_file(f.path);
    uint64_t reach = 0;
    if (__builtin_mul_overflow(uint64_t(n - 1), uint64_t(st), &reach) || __builtin_add_overflow(last, reach, &last))
      throw error(errc::corrupt, what + ": its view overflows").with_file(f.path);
    if (n != 1 && st != expect) row_major = false;
    expect *= n;
  }
  uint64_t end_bytes = 0;
  if (__builtin_mul_overflow(last + 1, element, &end_bytes) || end_bytes > s.nbytes)
    throw error(errc::corrupt, what + ": its view reaches past the end of its storage (" + std::to_string(s.nbytes) +
                                   " bytes)")
        .with_file(f.path);
  base_ = *s.file_offset + uint64_t(t.storage_offset) * element;
  if (row_major) {
    kind_ = source_kind::contiguous;
    return;
  }
  kind_ = source_kind::strided;
  span_bytes_ = end_bytes - uint64_t(t.storage_offset) * element;
  if (span_bytes_ > kMaxGatherSpan)
    throw error(errc::unsupported, what + " is a non-contiguous view spanning " + std::to_string(span_bytes_) +
                                       " bytes of its storage; diff gathers views of at most " +
                                       std::to_string(kMaxGatherSpan) + " bytes")
        .with_file(f.path);
  shape_.assign(t.shape.begin(), t.shape.end());
  stride_.assign(t.stride.begin(), t.stride.end());
}

key_reader::key_reader(const checkpoint& c, std::string name, const assembly& a, const assembled_tensor& t)
    : name_(std::move(name)), type_(t.type), nbytes_(t.nbytes), kind_(source_kind::assembled) {
  // No format ckptool reads assembles big-endian pieces (the loader refuses them too).
  if (c.byteorder == "big") throw error(errc::unsupported, "key '" + name_ + "' is assembled from big-endian pieces");
  for (size_t s : t.storages) {
    const storage_record& r = c.storages[s];
    pieces_.push_back({c.files.at(r.file).source.get(), *r.file_offset, a.landing(s)});
  }
}

void key_reader::read(uint64_t offset, size_t n, uint8_t* dst) {
  if (n == 0) return;
  switch (kind_) {
    case source_kind::contiguous: file_->read_exact(base_ + offset, dst, n); break;
    case source_kind::strided: read_strided(offset, n, dst); break;
    case source_kind::assembled: read_assembled(offset, n, dst); return;
    case source_kind::none: throw error(errc::unsupported, "key '" + name_ + "' has no data in the file");
  }
  if (swap_width_ > 1) {
    // Windows are whole elements, and an element is whole swap groups (checked above).
    if (offset % swap_width_ || n % swap_width_) throw std::logic_error("key_reader: a window splits an element");
    byteswap_in_place(dst, n, swap_width_);
  }
}

void key_reader::read_strided(uint64_t offset, size_t n, uint8_t* dst) {
  if (span_.empty()) span_ = file_->read_vector(base_, size_t(span_bytes_));
  const uint64_t element = element_size(type_);
  const size_t rank = shape_.size();
  // The row-major index of the first element, as digits over the shape.
  std::vector<int64_t> index(rank, 0);
  uint64_t rest = offset / element;
  for (size_t d = rank; d-- > 0;) {
    index[d] = int64_t(rest % uint64_t(shape_[d]));
    rest /= uint64_t(shape_[d]);
  }
  for (size_t done = 0; done < n; done += element) {
    uint64_t at = 0;
    for (size_t d = 0; d < rank; ++d) at += uint64_t(index[d]) * uint64_t(stride_[d]);
    std::memcpy(dst + done, span_.data() + at * element, element);
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < shape_[d]) break;
      index[d] = 0;
    }
  }
}

void key_reader::read_assembled(uint64_t offset, size_t n, uint8_t* dst) {
  const uint64_t w0 = offset, w1 = offset + n;
  for (const piece& p : pieces_) {
    const box_landing& b = *p.landing;
    if (b.contiguous()) {
      const uint64_t lo = std::max(w0, b.offset), hi = std::min(w1, b.offset + b.nbytes);
      if (lo < hi) p.file->read_exact(p.offset + (lo - b.offset), dst + (lo - w0), size_t(hi - lo));
      continue;
    }
    // The piece's runs that land in [w0, w1) are consecutive in the piece: one read.
    const uint64_t runs = b.nbytes / b.run_bytes;
    const uint64_t r0 = first_run(b, runs, [&](uint64_t start) { return start + b.run_bytes > w0; });
    if (r0 == runs || run_start(b, r0) >= w1) continue;
    const uint64_t r1 = first_run(b, runs, [&](uint64_t start) { return start >= w1; }) - 1;
    const uint64_t s0 = run_start(b, r0), s1 = run_start(b, r1);
    const uint64_t from = r0 * b.run_bytes + (w0 > s0 ? w0 - s0 : 0);
    const uint64_t to = r1 * b.run_bytes + std::min(b.run_bytes, w1 - s1);
    bounce_.resize(size_t(to - from));
    p.file->read_exact(p.offset + from, bounce_.data(), bounce_.size());
    for_each_span(b, from, to - from, [&](const box_span& s) {
      const uint8_t* src = bounce_.data() + (s.piece_offset - from);
      for (uint64_t row = 0; row < s.rows; ++row)
        std::memcpy(dst + (s.dst_offset + row * s.pitch - w0), src + row * s.width, size_t(s.width));
    });
  }
}

}  // namespace ckpt::detail
