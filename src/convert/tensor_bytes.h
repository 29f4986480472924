// Internal: where a converted tensor's bytes come from (convert.h). A tensor that is one
// contiguous range of a file is copied straight from it; anything else (a strided view, a
// tensor assembled from DCP pieces, bytes held in memory after a DCP transform) is
// gathered into a buffer of exactly its size, which the caller writes and frees before
// the next: peak memory is one tensor (plus a piece's bounce buffer), never the model.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/convert.h"
#include "model/assembly.h"

namespace ckpt::detail {

/// The strides torch gives a new tensor of `shape` (row-major; a dimension of size 0 counts
/// as 1, as in torch's contiguous_strides), which the writers record for every tensor they
/// write as one contiguous run.
inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    stride[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return stride;
}

/// Bytes of an open file a tensor is, as they are.
struct file_range {
  int fd = -1;
  const std::string* name = nullptr;  // the file, for messages
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  /// The CRC-32 of exactly these bytes, when the input's zip directory gives it (the
  /// tensor is a whole stored record).
  std::optional<uint32_t> crc32;
};

struct tensor_buffer {
  std::unique_ptr<uint8_t[]> bytes;
  uint64_t nbytes = 0;
};

class tensor_bytes {
 public:
  /// Lays out the plan's assembled tensors (checked by plan_convert already); `request`'s
  /// cast function converts the tensors the plan casts.
  tensor_bytes(const checkpoint& c, const convert_plan& plan, const convert_request& request);

  /// The file range tensor t is, when it is one (a contiguous view of a storage in a file
  /// on disk); nullopt when it must be gathered.
  std::optional<file_range> straight_range(const convert_tensor& t) const;
  /// The file ranges an assembled tensor is, in order, when each of its pieces lands as one
  /// contiguous range of it and no cast is asked (a DCP tensor split in rows of dimension
  /// 0, FSDP's and `--ranks`' default): copied one after another, they are its bytes, and
  /// no buffer of the tensor is needed. nullopt when it must be gathered.
  std::optional<std::vector<file_range>> straight_pieces(const convert_tensor& t) const;
  /// Tensor t's bytes, contiguous and cast, in a buffer of their own. Throws errc::corrupt or io
  /// (naming the file) when the input ends early or cannot be read.
  tensor_buffer gather(const convert_tensor& t) const;

  /// Rows [row0, row0 + rows) of dimension 0 (a 0-dim tensor is one row): one band of the
  /// row-major tensor, which is what a DCP Shard(0) chunk holds. straight_rows is the file
  /// range the band is, when the tensor is one; gather_rows reads the band alone (cast),
  /// never the whole tensor, from a view or from the DCP pieces it overlaps.
  std::optional<file_range> straight_rows(const convert_tensor& t, int64_t row0, int64_t rows) const;
  tensor_buffer gather_rows(const convert_tensor& t, int64_t row0, int64_t rows) const;
  /// The box offsets/sizes of t (a DCP chunk of another placement than Shard(0), a column
  /// band), row-major and cast, read alone: from a row-major record or the DCP pieces it
  /// meets as the strided runs it is (model/slice_plan.h), from a strided view as the view
  /// it is. Never the whole tensor.
  tensor_buffer gather_box(const convert_tensor& t, const std::vector<int64_t>& offsets,
                           const std::vector<int64_t>& sizes) const;

 private:
  tensor_buffer gather_view(const tensor_record& r, uint64_t nbytes) const;
  tensor_buffer gather_assembled(size_t key, uint64_t nbytes) const;
  tensor_buffer gather_assembled_rows(size_t key, uint64_t row_bytes, int64_t row0, int64_t rows) const;
  tensor_buffer cast(const convert_tensor& t, tensor_buffer in) const;

  const checkpoint& c_;
  const convert_request& request_;
  assembly assembly_;
  std::map<size_t, size_t> assembled_of_key_;  // c.keys index -> assembly_.tensors index
};

}  // namespace ckpt::detail
