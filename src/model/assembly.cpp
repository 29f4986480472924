#include "model/assembly.h"

#include <limits>
#include <string>

#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

std::string shape_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Multiplies without wrapping; nullopt past uint64_t.
bool mul(uint64_t a, uint64_t b, uint64_t& out) {
  if (a && b > std::numeric_limits<uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

struct box {
  std::vector<int64_t> offset, size;
};

bool disjoint(const box& a, const box& b) {
  for (size_t d = 0; d < a.offset.size(); ++d)
    if (a.offset[d] + a.size[d] <= b.offset[d] || b.offset[d] + b.size[d] <= a.offset[d]) return true;
  return false;
}

// The runs of `b` in the row-major tensor of `shape` (assembly.h).
box_landing land(const std::vector<int64_t>& shape, const box& b, uint64_t element_bytes, uint64_t nbytes) {
  const size_t rank = shape.size();
  std::vector<uint64_t> stride(rank, element_bytes);  // in bytes
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * uint64_t(shape[d]);
  box_landing l;
  l.nbytes = nbytes;
  for (size_t d = 0; d < rank; ++d) l.offset += uint64_t(b.offset[d]) * stride[d];
  // The innermost dimension the box does not span whole; those inside it are whole.
  size_t cut = rank;
  while (cut > 0 && b.size[cut - 1] == shape[cut - 1]) --cut;
  if (cut == 0) {
    l.run_bytes = nbytes;
    return l;
  }
  l.run_bytes = uint64_t(b.size[cut - 1]) * stride[cut - 1];
  for (size_t d = 0; d + 1 < cut; ++d) {
    if (b.size[d] == 1) continue;  // steps nowhere
    l.counts.push_back(uint64_t(b.size[d]));
    l.pitches.push_back(stride[d]);
  }
  if (l.counts.empty()) l.run_bytes = nbytes;
  return l;
}

}  // namespace

assembly plan_assembly(const checkpoint& c, const std::vector<size_t>& keys, bool allow_unopened) {
  assembly out;
  for (size_t k : keys) {
    if (!is_assembled(c.keys, k)) continue;  // held whole by a record
    const std::string name = "key '" + std::string(c.keys.key(k)) + "'";
    const dtype type = c.keys.type(k, c.tensors);
    const dim_list& dims = c.keys.shape(k, c.tensors);
    const std::vector<int64_t> shape(dims.begin(), dims.end());
    const uint64_t element_bytes = element_size(type);
    if (elements_per_byte(type) != 1 || element_bytes == 0)
      throw_unsupported(name + ": pieces of dtype " + std::string(ckpt::name(type)) + " are not assembled");
    uint64_t numel = 1;
    for (int64_t n : shape) {
      if (n < 0) throw_corrupt(name + ": negative size in its shape " + shape_text(shape));
      if (!mul(numel, uint64_t(n), numel)) throw_limit(name + ": shape " + shape_text(shape) + " is too large");
    }
    assembled_tensor t;
    t.key = k;
    t.type = type;
    t.shape = shape;
    if (!mul(numel, element_bytes, t.nbytes)) throw_limit(name + ": shape " + shape_text(shape) + " is too large");

    std::vector<box> boxes;
    uint64_t covered = 0;
    const size_t pieces = c.keys.piece_count(k);
    for (size_t p = 0; p < pieces; ++p) {
      const tensor_piece piece = c.keys.piece(k, p);
      const std::string what = name + ", piece " + std::to_string(p);
      if (piece.tensor >= c.tensors.size()) throw_corrupt(what + ": names a tensor the checkpoint lacks");
      const tensor_record& r = c.tensors[piece.tensor];
      if (r.type != type)
        throw_corrupt(what + ": holds " + std::string(ckpt::name(r.type)) + " data for a key of dtype " +
                      std::string(ckpt::name(type)));
      if (r.shape.size() != shape.size())
        throw_corrupt(what + ": a box of " + std::to_string(r.shape.size()) + " dimensions in a tensor of " +
                      std::to_string(shape.size()));
      box b;
      b.offset = piece.offsets.empty() ? std::vector<int64_t>(shape.size(), 0) : piece.offsets;
      b.size.assign(r.shape.begin(), r.shape.end());
      uint64_t piece_numel = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        const int64_t o = b.offset[d], n = b.size[d];
        if (o < 0 || n < 0 || o > shape[d] || n > shape[d] - o)
          throw_corrupt(what + ": its box at " + shape_text(b.offset) + " of size " + shape_text(b.size) +
                        " lies outside the shape " + shape_text(shape));
        piece_numel *= uint64_t(n);  // bounded by numel: the box is inside
      }
      if (piece_numel == 0) continue;  // nothing to land
      if (r.composite() || r.quant || r.kind)
        throw_unsupported(what + ": a " + (r.kind ? r.kind->description() : std::string("quantized")) +
                          " tensor as a piece is not assembled");
      if (r.conj || r.neg)
        throw_unsupported(what + ": a piece with the " + (r.conj ? "conjugate" : "negative") +
                          " bit set is not assembled (its bytes are not its values)");
      if (!r.storage || *r.storage >= c.storages.size() || !c.storages[*r.storage].file_offset)
        throw_unsupported(what + ": has no data in the file");
      // Pieces are read whole, storage by storage: the storage must be the box's bytes in
      // row-major order, nothing before or after.
      bool row_major = r.stride.size() == shape.size();
      int64_t expect = 1;
      for (size_t d = shape.size(); row_major && d-- > 0;) {
        if (b.size[d] != 1 && r.stride[d] != expect) row_major = false;
        expect *= b.size[d];
      }
      const storage_record& s = c.storages[*r.storage];
      const uint64_t piece_bytes = piece_numel * element_bytes;
      const bool unopened = allow_unopened && s.archive_range;  // its bytes are unknown, not wrong
      if (!row_major || r.storage_offset != 0 || (!unopened && s.nbytes != piece_bytes))
        throw_unsupported(what + ": its data is not exactly its box in row-major order (" +
                          std::to_string(s.nbytes) + " bytes stored for " + std::to_string(piece_bytes) + ")");
      for (const box& other : boxes)
        if (!disjoint(b, other))
          throw_corrupt(what + ": its box at " + shape_text(b.offset) + " of size " + shape_text(b.size) +
                        " overlaps another piece's");
      if (out.landing_of_storage.empty()) {
        out.landing_of_storage.assign(c.storages.size(), 0);
        out.tensor_of_storage.assign(c.storages.size(), 0);
      }
      if (out.landing_of_storage[*r.storage])
        throw_unsupported(what + ": its storage is also another piece's");
      if (out.landings.size() >= std::numeric_limits<uint32_t>::max() - 1 ||
          out.tensors.size() >= std::numeric_limits<uint32_t>::max())
        throw_limit("more than 2^32 pieces");
      out.landings.push_back(land(shape, b, element_bytes, piece_bytes));
      out.landing_of_storage[*r.storage] = uint32_t(out.landings.size());
      out.tensor_of_storage[*r.storage] = uint32_t(out.tensors.size());
      t.storages.push_back(*r.storage);
      covered += piece_numel;
      boxes.push_back(std::move(b));
    }
    // Disjoint boxes inside the shape cover it exactly when their elements add up to it.
    if (covered != numel)
      throw_corrupt(name + ": its pieces hold " + std::to_string(covered) + " of its " + std::to_string(numel) +
                    " elements; the rest would be left unwritten");
    out.tensors.push_back(std::move(t));
  }
  return out;
}

}  // namespace ckpt::detail
