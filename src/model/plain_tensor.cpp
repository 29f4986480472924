#include "model/plain_tensor.h"

#include "ckpt/dtype.h"

namespace ckpt::detail {

std::optional<std::string> not_plain_reason(const checkpoint& c, const tensor_record& t) {
  if (t.composite()) return "is " + t.kind->description();
  if (t.kind && !t.kind->subclass.empty()) return "is a " + t.kind->subclass + " (a local shard at most)";
  if (t.quant) return "is quantized (" + std::string(name(t.type)) + ")";
  // Its bytes are not its values: a copy would lose the bit (x.resolve_conj() first).
  if (t.conj) return std::string("has the conjugate bit set (x.conj(); its stored bytes are unconjugated)");
  if (t.neg) return std::string("has the negative bit set (x.conj().imag; its stored bytes are unnegated)");
  if (elements_per_byte(t.type) != 1) return "packs several elements per byte (" + std::string(name(t.type)) + ")";
  if (!t.storage) return std::string("is a meta tensor (no data)");
  const storage_record& s = c.storages.at(*t.storage);
  if (!s.file_offset || s.archive_range) return std::string("has no data in the file");
  return std::nullopt;
}

}  // namespace ckpt::detail
