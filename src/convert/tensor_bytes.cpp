#include "convert/tensor_bytes.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ckpt/error.h"
#include "model/row_major.h"
#include "model/slice_plan.h"

namespace ckpt::detail {
namespace {

// A piece that does not land as one range goes through a bounce buffer this big.
constexpr uint64_t kBounceBytes = 16ull << 20;
// A strided view is read as the span of storage it reaches when that costs at most this
// much beyond the tensor itself; else row by row, so a small view of a huge storage never
// reads (or holds) the storage.
constexpr uint64_t kSpanSlack = 64ull << 20;

tensor_buffer make_buffer(uint64_t nbytes) {
  tensor_buffer b;
  b.nbytes = nbytes;
  b.bytes.reset(new uint8_t[std::max<uint64_t>(nbytes, 1)]);
  return b;
}

void read_from(const byte_source& src, uint64_t offset, void* dst, uint64_t n) {
  try {
    src.read_exact(offset, dst, size_t(n));
  } catch (error& e) {
    src.locate(e);
    throw;
  }
}

// Calls f(element offset, output element index) for every element of shape/stride in
// row-major order, the innermost dimension as one call per `run` of contiguous elements
// when its stride is 1 (f then gets the run's length).
template <class F>
void for_each_run(const dim_list& shape, const dim_list& stride, F&& f) {
  const size_t rank = shape.size();
  if (rank == 0) return f(uint64_t(0), uint64_t(1));
  const uint64_t inner = uint64_t(shape[rank - 1]);
  const bool unit = stride[rank - 1] == 1 || inner == 1;
  std::vector<int64_t> index(rank, 0);
  while (true) {
    uint64_t at = 0;
    for (size_t d = 0; d + 1 < rank; ++d) at += uint64_t(index[d]) * uint64_t(stride[d]);
    if (unit) {
      f(at, inner);
    } else {
      for (uint64_t i = 0; i < inner; ++i) f(at + i * uint64_t(stride[rank - 1]), uint64_t(1));
    }
    size_t d = rank - 1;
    while (d-- > 0) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d == size_t(-1)) return;
  }
}

}  // namespace

tensor_bytes::tensor_bytes(const checkpoint& c, const convert_plan& plan, const convert_request& request)
    : c_(c), request_(request) {
  std::vector<size_t> keys;
  for (const auto& t : plan.tensors)
    if (t.assembled) keys.push_back(*t.assembled);
  if (keys.empty()) return;
  assembly_ = plan_assembly(c, keys);
  for (size_t i = 0; i < assembly_.tensors.size(); ++i) assembled_of_key_[assembly_.tensors[i].key] = i;
}

std::optional<file_range> tensor_bytes::straight_range(const convert_tensor& t) const {
  if (!t.record || t.type != t.source_type) return std::nullopt;
  const tensor_record& r = c_.tensors[*t.record];
  if (!is_row_major(r)) return std::nullopt;
  const storage_record& s = c_.storages[*r.storage];
  const source_file& f = c_.files[s.file];
  const file_extent extent = f.source->in_file();
  if (!extent.file) return std::nullopt;
  file_range out;
  out.fd = extent.file->fd();
  out.name = &extent.file->name();
  const uint64_t first = uint64_t(r.storage_offset) * element_size(r.type);
  out.offset = extent.offset + *s.file_offset + first;
  out.nbytes = t.nbytes;
  if (first + t.nbytes > s.nbytes)
    throw error(errc::corrupt, "tensor " + t.source_key + " reaches past its storage").with_file(f.path);
  if (s.record && first == 0 && t.nbytes == s.nbytes) out.crc32 = s.record->crc32;
  return out;
}

std::optional<std::vector<file_range>> tensor_bytes::straight_pieces(const convert_tensor& t) const {
  if (!t.assembled || t.type != t.source_type) return std::nullopt;
  const assembled_tensor& a = assembly_.tensors.at(assembled_of_key_.at(*t.assembled));
  std::vector<std::pair<uint64_t, file_range>> landed;
  for (size_t s : a.storages) {
    const box_landing* l = assembly_.landing(s);
    const storage_record& st = c_.storages[s];
    if (!l || !l->contiguous() || !st.file_offset) return std::nullopt;
    const file_extent extent = c_.files[st.file].source->in_file();
    if (!extent.file) return std::nullopt;  // a transformed chunk (zstd): only read() gives its bytes
    file_range r;
    r.fd = extent.file->fd();
    r.name = &extent.file->name();
    r.offset = extent.offset + *st.file_offset;
    r.nbytes = l->nbytes;
    landed.emplace_back(l->offset, r);
  }
  std::sort(landed.begin(), landed.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<file_range> out;
  uint64_t next = 0;
  for (const auto& [at, r] : landed) {
    if (at != next) return std::nullopt;  // a gap or an overlap: the layout's checks are gather's
    next += r.nbytes;
    if (r.nbytes) out.push_back(r);
  }
  if (next != t.source_nbytes) return std::nullopt;
  return out;
}

tensor_buffer tensor_bytes::gather(const convert_tensor& t) const {
  tensor_buffer in = t.assembled ? gather_assembled(*t.assembled, t.source_nbytes)
                                 : gather_view(c_.tensors[*t.record], t.source_nbytes);
  return cast(t, std::move(in));
}

tensor_buffer tensor_bytes::cast(const convert_tensor& t, tensor_buffer in) const {
  if (t.type == t.source_type) return in;
  const uint64_t count = in.nbytes / element_size(t.source_type);
  tensor_buffer out = make_buffer(count * element_size(t.type));
  request_.cast(in.bytes.get(), t.source_type, out.bytes.get(), t.type, count);
  return out;
}

namespace {
// Elements in one row of dimension 0 (a 0-dim tensor is one row of one element).
uint64_t row_elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= uint64_t(shape[d]);
  return n;
}
}  // namespace

std::optional<file_range> tensor_bytes::straight_rows(const convert_tensor& t, int64_t row0, int64_t rows) const {
  std::optional<file_range> whole = straight_range(t);
  if (!whole) return whole;
  const uint64_t row_bytes = row_elements(t.shape) * element_size(t.type);
  const uint64_t skip = uint64_t(row0) * row_bytes, n = uint64_t(rows) * row_bytes;
  if (skip == 0 && n == whole->nbytes) return whole;
  whole->offset += skip;
  whole->nbytes = n;
  whole->crc32.reset();  // the record's CRC is of the whole tensor
  return whole;
}

tensor_buffer tensor_bytes::gather_rows(const convert_tensor& t, int64_t row0, int64_t rows) const {
  const uint64_t row_bytes = row_elements(t.shape) * element_size(t.source_type);
  if (t.shape.empty() || (row0 == 0 && rows == t.shape[0])) return gather(t);
  if (t.assembled) return cast(t, gather_assembled_rows(*t.assembled, row_bytes, row0, rows));
  // The band of a view is a view: the same strides, `rows` rows from row0's element on.
  tensor_record band = c_.tensors[*t.record];
  band.storage_offset += row0 * band.stride[0];
  band.shape[0] = rows;
  return cast(t, gather_view(band, uint64_t(rows) * row_bytes));
}

tensor_buffer tensor_bytes::gather_box(const convert_tensor& t, const std::vector<int64_t>& offsets,
                                       const std::vector<int64_t>& sizes) const {
  const uint64_t es = element_size(t.source_type);
  if (elements_per_byte(t.source_type) != 1 || es == 0)
    throw error(errc::unsupported, "tensor " + t.source_key + ": its dtype " + std::string(name(t.source_type)) +
                                       " packs several elements in a byte and cannot be cut but in rows");
  std::vector<dim_range> box;
  uint64_t numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    box.push_back({offsets[d], sizes[d]});
    numel *= uint64_t(sizes[d]);
  }
  tensor_buffer out = make_buffer(numel * es);
  if (numel == 0) return cast(t, std::move(out));
  // Pieces, each a row-major box of the tensor from a file offset: the DCP chunks, or the
  // one record held whole.
  struct piece {
    std::vector<dim_range> box;
    const byte_source* file;
    uint64_t offset;
  };
  std::vector<piece> pieces;
  if (t.assembled) {
    for (size_t p = 0; p < c_.keys.piece_count(*t.assembled); ++p) {
      const tensor_piece tp = c_.keys.piece(*t.assembled, p);
      const tensor_record& r = c_.tensors[tp.tensor];
      piece pc;
      uint64_t n = 1;
      for (size_t d = 0; d < t.shape.size(); ++d) {
        pc.box.push_back({tp.offsets.empty() ? 0 : tp.offsets[d], r.shape[d]});
        n *= uint64_t(r.shape[d]);
      }
      if (n == 0 || !r.storage) continue;
      const storage_record& st = c_.storages[*r.storage];
      if (!st.file_offset) throw error(errc::io, "a piece of '" + t.source_key + "' has no data (internal error)");
      pc.file = c_.files[st.file].source.get();
      pc.offset = *st.file_offset;
      pieces.push_back(std::move(pc));
    }
  } else {
    const tensor_record& r = c_.tensors[*t.record];
    if (!is_row_major(r) || r.storage_offset < 0) {
      // The box of a view is a view: the same strides, from the box's first element.
      tensor_record v = r;
      for (size_t d = 0; d < box.size(); ++d) {
        v.storage_offset += box[d].start * r.stride[d];
        v.shape[d] = box[d].length;
      }
      return cast(t, gather_view(v, out.nbytes));
    }
    const storage_record& st = c_.storages[*r.storage];
    if (uint64_t(r.storage_offset) * es + t.source_nbytes > st.nbytes)
      throw error(errc::corrupt, "tensor " + t.source_key + " reaches past its storage").with_file(c_.files[st.file].path);
    piece pc;
    for (int64_t n : t.shape) pc.box.push_back({0, n});
    pc.file = c_.files[st.file].source.get();
    pc.offset = *st.file_offset + uint64_t(r.storage_offset) * es;
    pieces.push_back(std::move(pc));
  }
  uint64_t landed = 0;
  for (const piece& pc : pieces) {
    std::vector<slice_span> spans;
    intersect_piece(box, pc.box, es, pc.offset, spans);
    landed += span_bytes(spans);
    read_spans(*pc.file, spans, out.bytes.get());
  }
  // Pieces cover their tensor exactly (plan_assembly checked them), so every box.
  if (landed != out.nbytes)
    throw error(errc::corrupt, "tensor " + t.source_key + ": its pieces hold " + std::to_string(landed) + " of the " +
                                   std::to_string(out.nbytes) + " bytes of a chunk");
  return cast(t, std::move(out));
}

tensor_buffer tensor_bytes::gather_view(const tensor_record& r, uint64_t nbytes) const {
  tensor_buffer out = make_buffer(nbytes);
  if (nbytes == 0) return out;
  const storage_record& s = c_.storages[*r.storage];
  const byte_source& src = *c_.files[s.file].source;
  const uint64_t es = element_size(r.type);
  const uint64_t base = *s.file_offset + uint64_t(r.storage_offset) * es;
  uint64_t last = 0;  // the farthest element reached, in elements from the first
  for (size_t d = 0; d < r.shape.size(); ++d) last += uint64_t(r.shape[d] - 1) * uint64_t(r.stride[d]);
  const uint64_t span = (last + 1) * es;
  uint8_t* dst = out.bytes.get();
  if (span <= nbytes + kSpanSlack) {
    std::unique_ptr<uint8_t[]> window(new uint8_t[span]);
    read_from(src, base, window.get(), span);
    for_each_run(r.shape, r.stride, [&](uint64_t at, uint64_t n) {
      std::memcpy(dst, window.get() + at * es, n * es);
      dst += n * es;
    });
  } else if (r.shape.back() > 1 && r.stride.back() != 1) {
    // Element by element (a row band of a transposed tensor reaches across its whole
    // storage): one pread per element would take forever, so the span is read in windows
    // of kSpanSlack bytes, each pass landing the elements that fall in it.
    std::unique_ptr<uint8_t[]> window(new uint8_t[kSpanSlack]);
    for (uint64_t from = 0; from < span; from += kSpanSlack) {
      const uint64_t n = std::min(kSpanSlack, span - from);
      read_from(src, base + from, window.get(), n);
      uint8_t* at_dst = out.bytes.get();
      for_each_run(r.shape, r.stride, [&](uint64_t at, uint64_t) {
        const uint64_t byte = at * es;
        if (byte >= from && byte < from + n) std::memcpy(at_dst, window.get() + (byte - from), es);
        at_dst += es;
      });
    }
  } else {
    for_each_run(r.shape, r.stride, [&](uint64_t at, uint64_t n) {
      read_from(src, base + at * es, dst, n * es);
      dst += n * es;
    });
  }
  return out;
}

tensor_buffer tensor_bytes::gather_assembled(size_t key, uint64_t nbytes) const {
  const assembled_tensor& a = assembly_.tensors.at(assembled_of_key_.at(key));
  tensor_buffer out = make_buffer(nbytes);
  uint8_t* dst = out.bytes.get();
  std::unique_ptr<uint8_t[]> bounce;
  for (size_t s : a.storages) {
    const box_landing* l = assembly_.landing(s);
    const storage_record& st = c_.storages[s];
    const byte_source& src = *c_.files[st.file].source;
    if (l->contiguous()) {
      read_from(src, *st.file_offset, dst + l->offset, l->nbytes);
      continue;
    }
    if (!bounce) bounce.reset(new uint8_t[kBounceBytes]);
    for (uint64_t from = 0; from < l->nbytes; from += kBounceBytes) {
      const uint64_t n = std::min(kBounceBytes, l->nbytes - from);
      read_from(src, *st.file_offset + from, bounce.get(), n);
      for_each_span(*l, from, n, [&](const box_span& sp) {
        for (uint64_t row = 0; row < sp.rows; ++row)
          std::memcpy(dst + sp.dst_offset + row * sp.pitch, bounce.get() + (sp.piece_offset - from) + row * sp.width,
                      sp.width);
      });
    }
  }
  return out;
}

// The band is bytes [band_begin, band_end) of the row-major tensor. A piece's rows of
// dimension 0 are its outermost, so the piece rows inside the band are one range of the
// piece: read it (through the bounce buffer) and land its spans less band_begin.
tensor_buffer tensor_bytes::gather_assembled_rows(size_t key, uint64_t row_bytes, int64_t row0, int64_t rows) const {
  const uint64_t band_begin = uint64_t(row0) * row_bytes, band_bytes = uint64_t(rows) * row_bytes;
  tensor_buffer out = make_buffer(band_bytes);
  if (band_bytes == 0) return out;
  uint8_t* dst = out.bytes.get();
  std::unique_ptr<uint8_t[]> bounce;
  const size_t pieces = c_.keys.piece_count(key);
  for (size_t p = 0; p < pieces; ++p) {
    const tensor_piece piece = c_.keys.piece(key, p);
    const tensor_record& r = c_.tensors[piece.tensor];
    if (!r.storage) continue;
    const box_landing* l = assembly_.landing(*r.storage);
    if (!l) continue;  // an empty box: nothing lands
    const int64_t p0 = piece.offsets.empty() ? 0 : piece.offsets[0];
    const int64_t p_rows = r.shape.empty() ? 1 : r.shape[0];
    const int64_t lo = std::max(p0, row0), hi = std::min(p0 + p_rows, row0 + rows);
    if (lo >= hi) continue;
    const uint64_t piece_row = l->nbytes / uint64_t(p_rows);
    const uint64_t from = uint64_t(lo - p0) * piece_row, n = uint64_t(hi - lo) * piece_row;
    const storage_record& st = c_.storages[*r.storage];
    const byte_source& src = *c_.files[st.file].source;
    if (!bounce) bounce.reset(new uint8_t[kBounceBytes]);
    for (uint64_t at = from; at < from + n; at += kBounceBytes) {
      const uint64_t len = std::min(kBounceBytes, from + n - at);
      read_from(src, *st.file_offset + at, bounce.get(), len);
      for_each_span(*l, at, len, [&](const box_span& sp) {
        for (uint64_t row = 0; row < sp.rows; ++row) {
          const uint64_t to = sp.dst_offset + row * sp.pitch;
          if (to < band_begin || to + sp.width > band_begin + band_bytes)
            throw error(errc::io, "a piece of key '" + std::string(c_.keys.key(key)) +
                                      "' lands outside its band (internal error)");
          std::memcpy(dst + (to - band_begin), bounce.get() + (sp.piece_offset - at) + row * sp.width, sp.width);
        }
      });
    }
  }
  return out;
}

}  // namespace ckpt::detail
