#include <string>

#include "ckpt/pickle.h"

namespace ckpt::pickle {

value* document::make(kind type, uint64_t offset) {
  value& v = nodes_.emplace_back();
  v.type = type;
  v.offset = offset;
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
