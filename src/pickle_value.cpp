#include <string>

#include "ckpt/pickle.h"

static_assert(sizeof(ckpt::pickle::value) == 72, "see limits::max_values before growing a node");

namespace ckpt::pickle {

value* document::make(kind type, uint64_t offset) {
  value& v = nodes_.emplace_back();
  v.type = type;
  constexpr uint64_t kMaxOffset = (uint64_t(1) << 40) - 1;  // value::offset has 40 bits
  v.offset = offset < kMaxOffset ? offset : kMaxOffset;
  return &v;
}

std::string value::global_name() const {
  std::string out(global_module());
  out += '.';
  out += global_attr();
  return out;
}

const value* value::callable_global() const {
  if (type != kind::object || items.size() <= kCallable) return nullptr;
  const value* c = items[kCallable];
  return c && c->type == kind::global ? c : nullptr;
}

}  // namespace ckpt::pickle
