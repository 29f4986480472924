#include "ckpt/dtype.h"

#include <iterator>

namespace ckpt {
namespace {

// Legacy storage names: formats.md §3.2.
constexpr dtype_info kTable[] = {
    {dtype::boolean, "bool", 1, false, "BoolStorage"},
    {dtype::uint8, "uint8", 1, false, "ByteStorage"},
    {dtype::int8, "int8", 1, false, "CharStorage"},
    {dtype::int16, "int16", 2, false, "ShortStorage"},
    {dtype::int32, "int32", 4, false, "IntStorage"},
    {dtype::int64, "int64", 8, false, "LongStorage"},
    {dtype::uint16, "uint16", 2, false, nullptr},
    {dtype::uint32, "uint32", 4, false, nullptr},
    {dtype::uint64, "uint64", 8, false, nullptr},
    {dtype::float16, "float16", 2, true, "HalfStorage"},
    {dtype::bfloat16, "bfloat16", 2, true, "BFloat16Storage"},
    {dtype::float32, "float32", 4, true, "FloatStorage"},
    {dtype::float64, "float64", 8, true, "DoubleStorage"},
    {dtype::complex32, "complex32", 4, false, nullptr},
    {dtype::complex64, "complex64", 8, false, "ComplexFloatStorage"},
    {dtype::complex128, "complex128", 16, false, "ComplexDoubleStorage"},
    {dtype::float8_e5m2, "float8_e5m2", 1, true, nullptr},
    {dtype::float8_e4m3fn, "float8_e4m3fn", 1, true, nullptr},
    {dtype::float8_e5m2fnuz, "float8_e5m2fnuz", 1, true, nullptr},
    {dtype::float8_e4m3fnuz, "float8_e4m3fnuz", 1, true, nullptr},
    {dtype::float8_e8m0fnu, "float8_e8m0fnu", 1, true, nullptr},
    {dtype::float4_e2m1fn_x2, "float4_e2m1fn_x2", 1, false, nullptr},
    {dtype::qint8, "qint8", 1, false, "QInt8Storage"},
    {dtype::quint8, "quint8", 1, false, "QUInt8Storage"},
    {dtype::qint32, "qint32", 4, false, "QInt32Storage"},
    {dtype::quint4x2, "quint4x2", 1, false, "QUInt4x2Storage"},
    {dtype::quint2x4, "quint2x4", 1, false, "QUInt2x4Storage"},
    {dtype::bits8, "bits8", 1, false, nullptr},
    {dtype::bits16, "bits16", 2, false, nullptr},
    {dtype::bits1x8, "bits1x8", 1, false, nullptr},
    {dtype::bits2x4, "bits2x4", 1, false, nullptr},
    {dtype::bits4x2, "bits4x2", 1, false, nullptr},
};

// safetensors/src/tensor.rs `Dtype` and `bitsize`; F4 is torch's packed float4_e2m1fn_x2.
const safetensors_dtype kSafetensors[] = {
    {"BOOL", 8, dtype::boolean},
    {"F4", 4, dtype::float4_e2m1fn_x2},
    {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},
    {"U8", 8, dtype::uint8},
    {"I8", 8, dtype::int8},
    {"F8_E5M2", 8, dtype::float8_e5m2},
    {"F8_E4M3", 8, dtype::float8_e4m3fn},
    {"F8_E8M0", 8, dtype::float8_e8m0fnu},
    {"F8_E4M3FNUZ", 8, dtype::float8_e4m3fnuz},
    {"F8_E5M2FNUZ", 8, dtype::float8_e5m2fnuz},
    {"I16", 16, dtype::int16},
    {"U16", 16, dtype::uint16},
    {"F16", 16, dtype::float16},
    {"BF16", 16, dtype::bfloat16},
    {"I32", 32, dtype::int32},
    {"U32", 32, dtype::uint32},
    {"F32", 32, dtype::float32},
    {"C64", 64, dtype::complex64},
    {"F64", 64, dtype::float64},
    {"I64", 64, dtype::int64},
    {"U64", 64, dtype::uint64},
};

struct alias {
  const char* name;
  dtype type;
};
// torch.float is torch.float32, and so on: the names `torch.<alias>` a pickle may use.
constexpr alias kAliases[] = {
    {"float", dtype::float32},       {"double", dtype::float64},   {"half", dtype::float16},
    {"long", dtype::int64},          {"int", dtype::int32},        {"short", dtype::int16},
    {"cfloat", dtype::complex64},    {"cdouble", dtype::complex128}, {"chalf", dtype::complex32},
};

}  // namespace

const dtype_info& info(dtype t) { return kTable[static_cast<size_t>(t)]; }

std::optional<dtype> dtype_from_name(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (const auto& row : kTable)
    if (name == row.name) return row.type;
  for (const auto& a : kAliases)
    if (name == a.name) return a.type;
  return std::nullopt;
}

std::optional<dtype> dtype_from_legacy_storage(std::string_view storage_class) {
  for (const auto& row : kTable)
    if (row.legacy_storage && storage_class == row.legacy_storage) return row.type;
  return std::nullopt;
}

const safetensors_dtype* safetensors_dtype_named(std::string_view st_name) {
  for (const auto& row : kSafetensors)
    if (st_name == row.name) return &row;
  return nullptr;
}

static_assert(std::size(kTable) == static_cast<size_t>(dtype::bits4x2) + 1,
              "kTable must list every dtype in enum order");

}  // namespace ckpt
