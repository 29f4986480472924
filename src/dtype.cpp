#include "ckpt/dtype.h"

#include <iterator>

namespace ckpt {
namespace {

// Legacy storage names and safetensors names: formats.md §3.2 and §6.
constexpr dtype_info kTable[] = {
    {dtype::boolean, "bool", 1, false, "BoolStorage", "BOOL"},
    {dtype::uint8, "uint8", 1, false, "ByteStorage", "U8"},
    {dtype::int8, "int8", 1, false, "CharStorage", "I8"},
    {dtype::int16, "int16", 2, false, "ShortStorage", "I16"},
    {dtype::int32, "int32", 4, false, "IntStorage", "I32"},
    {dtype::int64, "int64", 8, false, "LongStorage", "I64"},
    {dtype::uint16, "uint16", 2, false, nullptr, "U16"},
    {dtype::uint32, "uint32", 4, false, nullptr, "U32"},
    {dtype::uint64, "uint64", 8, false, nullptr, "U64"},
    {dtype::float16, "float16", 2, true, "HalfStorage", "F16"},
    {dtype::bfloat16, "bfloat16", 2, true, "BFloat16Storage", "BF16"},
    {dtype::float32, "float32", 4, true, "FloatStorage", "F32"},
    {dtype::float64, "float64", 8, true, "DoubleStorage", "F64"},
    {dtype::complex32, "complex32", 4, false, nullptr, nullptr},
    {dtype::complex64, "complex64", 8, false, "ComplexFloatStorage", "C64"},
    {dtype::complex128, "complex128", 16, false, "ComplexDoubleStorage", nullptr},
    {dtype::float8_e5m2, "float8_e5m2", 1, true, nullptr, "F8_E5M2"},
    {dtype::float8_e4m3fn, "float8_e4m3fn", 1, true, nullptr, "F8_E4M3"},
    {dtype::float8_e5m2fnuz, "float8_e5m2fnuz", 1, true, nullptr, "F8_E5M2FNUZ"},
    {dtype::float8_e4m3fnuz, "float8_e4m3fnuz", 1, true, nullptr, "F8_E4M3FNUZ"},
    {dtype::float8_e8m0fnu, "float8_e8m0fnu", 1, true, nullptr, "F8_E8M0"},
    {dtype::float4_e2m1fn_x2, "float4_e2m1fn_x2", 1, false, nullptr, "F4"},
    {dtype::qint8, "qint8", 1, false, "QInt8Storage", nullptr},
    {dtype::quint8, "quint8", 1, false, "QUInt8Storage", nullptr},
    {dtype::qint32, "qint32", 4, false, "QInt32Storage", nullptr},
    {dtype::quint4x2, "quint4x2", 1, false, "QUInt4x2Storage", nullptr},
    {dtype::quint2x4, "quint2x4", 1, false, "QUInt2x4Storage", nullptr},
    {dtype::bits8, "bits8", 1, false, nullptr, nullptr},
    {dtype::bits16, "bits16", 2, false, nullptr, nullptr},
    {dtype::bits1x8, "bits1x8", 1, false, nullptr, nullptr},
    {dtype::bits2x4, "bits2x4", 1, false, nullptr, nullptr},
    {dtype::bits4x2, "bits4x2", 1, false, nullptr, nullptr},
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

std::optional<dtype> dtype_from_safetensors(std::string_view st_name) {
  for (const auto& row : kTable)
    if (row.safetensors && st_name == row.safetensors) return row.type;
  return std::nullopt;
}

static_assert(std::size(kTable) == static_cast<size_t>(dtype::bits4x2) + 1,
              "kTable must list every dtype in enum order");

}  // namespace ckpt
