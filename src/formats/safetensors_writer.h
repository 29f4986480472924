// Writes a safetensors file as a stream, byte-identical to what the reference library
// (`safetensors.torch.save_file`, 0.8.0) writes for the same tensors: formats.md §6.1.
//
// The caller describes every tensor first (name, dtype, torch shape, byte count) and the
// optional `__metadata__`; plan() validates them and lays out the header and the data
// offsets. write() then emits the header and asks the caller for each tensor's bytes in
// file order through a sink, so the data can come from anywhere (a mapped file, a read
// plan, copy_file_range later) without a whole-model buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/output_set.h"
#include "ckpt/safetensors.h"

namespace ckpt::safetensors {

struct tensor_spec {
  std::string name;
  dtype type;
  std::vector<int64_t> shape;  // torch's shape (float4_e2m1fn_x2: packed, two per byte)
  uint64_t nbytes = 0;         // must equal the shape's element count x element size
};

using metadata_map = std::vector<std::pair<std::string, std::string>>;

struct file_layout {
  /// The first 8 + N bytes of the file: the length, the JSON, the padding spaces.
  std::string header;
  /// Indices into the caller's tensor list, in the order their bytes follow the header.
  std::vector<size_t> order;
  /// Per caller index: where its bytes begin, relative to the data buffer.
  std::vector<uint64_t> begin;
  uint64_t data_size = 0;
  uint64_t file_size() const { return header.size() + data_size; }
};

/// The safetensors name of `t` ("F32"), or nullptr when safetensors cannot hold it
/// (complex32, complex128, quantized and bits types).
const char* writable_dtype_name(dtype t);

/// Validates the tensors and lays the file out. Throws ckpt::error:
///   unsupported: a dtype safetensors cannot hold, a 0-dim float4_e2m1fn_x2, a name that is
///     empty, not UTF-8, `__metadata__`, or given twice; metadata keys or values not UTF-8,
///     a metadata key twice; a negative dimension; nbytes that disagree with the shape;
///   limit: past `lim` (tensors, name length, rank) or a header over kMaxHeaderSize, the
///     limits ckptool's reader applies, so that every file written reads back.
/// `metadata`: nullopt writes no `__metadata__`; an empty map writes `"__metadata__":{}`
/// as the reference does. Its pairs are written in the given order (the reference's order
/// is its HashMap's, which varies from run to run: only 0 or 1 pairs are reproducible).
file_layout plan(const std::vector<tensor_spec>& tensors, const std::optional<metadata_map>& metadata,
                 const limits& lim = {});

/// Receives one tensor's bytes; write() checks that exactly nbytes arrived.
class tensor_sink {
 public:
  explicit tensor_sink(output_file& out) : out_(out) {}
  void write(const void* buf, size_t n);
  /// The next `n` bytes are bytes [offset, offset + n) of open file `fd` (named `name`):
  /// copied in the kernel where it can (copy_file_range), never through a tensor buffer.
  void copy(int fd, const std::string& name, uint64_t offset, uint64_t n);
  uint64_t written() const { return written_; }

 private:
  friend void write(output_file&, const file_layout&, const std::vector<tensor_spec>&,
                    const std::function<void(size_t, tensor_sink&)>&);
  output_file& out_;
  uint64_t expected_ = 0;
  uint64_t written_ = 0;
  const std::string* name_ = nullptr;
};

/// Writes the header, then calls `supply(index, sink)` for each tensor in file order (the
/// index is the caller's). Throws errc::corrupt naming the tensor when a supply gives more
/// or fewer bytes than its nbytes, errc::io when writing fails. Committing `out`'s set is
/// the caller's: a failure here leaves the destination as it was.
void write(output_file& out, const file_layout& layout, const std::vector<tensor_spec>& tensors,
           const std::function<void(size_t index, tensor_sink& sink)>& supply);

}  // namespace ckpt::safetensors
