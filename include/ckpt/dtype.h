// Tensor element types as PyTorch names them, with the names each file format uses for them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ckpt {

enum class dtype : uint8_t {
  boolean, uint8, int8, int16, int32, int64, uint16, uint32, uint64,
  float16, bfloat16, float32, float64,
  complex32, complex64, complex128,
  float8_e5m2, float8_e4m3fn, float8_e5m2fnuz, float8_e4m3fnuz, float8_e8m0fnu,
  float4_e2m1fn_x2,
  qint8, quint8, qint32, quint4x2, quint2x4,
  bits8, bits16, bits1x8, bits2x4, bits4x2,
};

struct dtype_info {
  dtype type;
  const char* name;            // PyTorch's name without "torch.": "float32", "bool", ...
  uint32_t element_size;       // bytes per element as stored (float4_e2m1fn_x2 packs 2 in 1)
  bool is_floating;            // eligible for --dtype casts and --check-finite
  const char* legacy_storage;  // "FloatStorage", or nullptr for dtypes saved as UntypedStorage
};

/// A dtype as safetensors names it (safetensors/src/tensor.rs `Dtype`; docs/formats.md §6).
struct safetensors_dtype {
  const char* name;            // "F32"
  uint32_t bits;               // per element: F4 is 4, F6_* are 6
  std::optional<dtype> torch;  // nullopt: valid safetensors, but torch has no such dtype
};

const dtype_info& info(dtype t);
inline const char* name(dtype t) { return info(t).name; }
inline uint32_t element_size(dtype t) { return info(t).element_size; }
/// Elements packed into one byte: 2 for quint4x2, 4 for quint2x4 (their storages count
/// bytes, their tensors elements), 1 for every other dtype.
inline uint32_t elements_per_byte(dtype t) { return t == dtype::quint4x2 ? 2 : t == dtype::quint2x4 ? 4 : 1; }

/// "float32" or "torch.float32"; also PyTorch's aliases ("float", "half", "long", ...).
std::optional<dtype> dtype_from_name(std::string_view name);
/// "FloatStorage" -> float32 (the typed storage classes torch.save still writes).
std::optional<dtype> dtype_from_legacy_storage(std::string_view storage_class);
/// "F32" -> its row; nullptr for a name safetensors does not define.
const safetensors_dtype* safetensors_dtype_named(std::string_view st_name);

}  // namespace ckpt
