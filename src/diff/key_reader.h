// Internal: a state-dict key's elements as bytes in row-major order of its (global) shape,
// read by ranges, so diff holds a window of each tensor and never a whole one. Three
// shapes of data: one contiguous range of a file (read straight), a strided view of a
// storage (its storage span read once, at most kMaxGatherSpan bytes, then gathered), and a
// tensor assembled from DCP pieces (assembly.h: each piece's bytes that land in the range
// are found by bisecting its runs, read with one call and scattered).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "model/assembly.h"

namespace ckpt::detail {

class key_reader {
 public:
  /// Bytes of a strided view's storage span read at once: a larger non-contiguous view is
  /// refused (errc::unsupported) rather than read element by element.
  static constexpr uint64_t kMaxGatherSpan = 256ull << 20;

  /// Tensor record `tensor` of c, named `name` in messages. Throws errc::unsupported
  /// naming it for data it cannot read exactly (sparse, nested and quantized tensors, a
  /// strided view of a storage span above kMaxGatherSpan), errc::corrupt for a view
  /// outside its storage.
  key_reader(const checkpoint& c, std::string name, size_t tensor);
  /// An assembled key: `t` and its landings are from plan_assembly `a` over c.
  key_reader(const checkpoint& c, std::string name, const assembly& a, const assembled_tensor& t);

  dtype type() const { return type_; }
  uint64_t nbytes() const { return nbytes_; }
  /// False for a tensor whose data the file does not hold (a meta tensor).
  bool has_data() const { return has_data_; }
  /// Copies the tensor's bytes [offset, offset + n) in row-major order into dst.
  void read(uint64_t offset, size_t n, uint8_t* dst);

 private:
  enum class source_kind { none, contiguous, strided, assembled };
  void read_strided(uint64_t offset, size_t n, uint8_t* dst);
  void read_assembled(uint64_t offset, size_t n, uint8_t* dst);

  std::string name_;
  dtype type_ = dtype::float32;
  uint64_t nbytes_ = 0;
  bool has_data_ = true;
  uint32_t swap_width_ = 0;  // big-endian data: the byte groups torch.load reverses
  source_kind kind_ = source_kind::none;
  // contiguous and strided: the storage's file and where the bytes start in it
  const byte_source* file_ = nullptr;
  uint64_t base_ = 0;
  // strided: shape and strides in elements; the span is read on first use
  std::vector<int64_t> shape_, stride_;
  uint64_t span_bytes_ = 0;
  std::vector<uint8_t> span_;
  // assembled
  struct piece {
    const byte_source* file;
    uint64_t offset;  // the piece's first byte in its file
    const box_landing* landing;
  };
  std::vector<piece> pieces_;
  std::vector<uint8_t> bounce_;
};

}  // namespace ckpt::detail
