#include "torch/aten_types.h"

#include <string>

#include "ckpt/error.h"

namespace ckpt::detail {

c10::ScalarType scalar_type(dtype t) {
  // c10 names dtypes exactly as ckpt::name does ("float32", "bfloat16", "float8_e4m3fn",
  // "qint8").
  const auto& by_name = c10::getStringToDtypeMap();
  auto it = by_name.find(name(t));
  if (it == by_name.end()) throw error(errc::unsupported, std::string("dtype ") + name(t) + " has no LibTorch equivalent");
  return it->second;
}

dtype from_scalar_type(c10::ScalarType t) {
  auto d = dtype_from_name(c10::getDtypeNames(t).first);
  if (!d) throw error(errc::unsupported, std::string("LibTorch dtype ") + c10::toString(t) + " has no ckptool name");
  return *d;
}

}  // namespace ckpt::detail
