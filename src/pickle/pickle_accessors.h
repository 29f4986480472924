// Reading pickle values for the readers that walk a decoded pickle (the tensor collector,
// the tensor kinds, pickled modules, the state-dict finder, the DCP decoder): every
// mismatch is a corrupt file, reported at the offending value's offset.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/pickle.h"
#include "base/text.h"

namespace ckpt::detail {

[[noreturn]] inline void bad(const pickle::value* at, const std::string& what) {
  throw_corrupt(what, at ? std::optional<uint64_t>(at->offset) : std::nullopt);
}

/// The value of string key `key` in dict `d`; nullptr when `d` is not a dict or has no
/// such key (the pickle machine keeps one entry per key, as Python's dict does).
inline const pickle::value* str_key(const pickle::value* d, std::string_view key) {
  if (!d || d->type != pickle::kind::dict) return nullptr;
  for (size_t i = 0; i < d->dict_size(); ++i)
    if (d->dict_key(i)->type == pickle::kind::str && d->dict_key(i)->text == key) return d->dict_value(i);
  return nullptr;
}

/// What Python would call the value's type: "int", "dict", "OrderedDict", or for an
/// object the global that makes it ("argparse.Namespace").
inline std::string python_type_of(const pickle::value* v) {
  if (v->type == pickle::kind::dict && v->flag) return "OrderedDict";
  if (v->type == pickle::kind::object) {
    const pickle::value* g = v->callable_global();
    return g ? g->global_name() : "object";
  }
  return text::python_type_name(v->type);
}

inline const pickle::value* arg(const pickle::value* args, size_t i) { return args->items[i]; }

inline int64_t as_int(const pickle::value* v, const char* what) {
  if (v->type == pickle::kind::integer) return v->integer;
  if (v->type == pickle::kind::boolean) return v->flag ? 1 : 0;
  bad(v, std::string(what) + " must be an integer");
}

inline bool as_bool(const pickle::value* v, const char* what) {
  if (v->type == pickle::kind::boolean) return v->flag;
  if (v->type == pickle::kind::integer && (v->integer == 0 || v->integer == 1)) return v->integer == 1;
  bad(v, std::string(what) + " must be a bool");
}

inline std::vector<int64_t> as_int_tuple(const pickle::value* v, const char* what) {
  std::vector<int64_t> out;
  out.reserve(v->items.size());
  for (const pickle::value* e : v->items) out.push_back(as_int(e, what));
  return out;
}

inline double as_number(const pickle::value* v, const char* what) {
  if (v->type == pickle::kind::floating) return v->floating;
  if (v->type == pickle::kind::integer) return double(v->integer);
  bad(v, std::string(what) + " must be a number");
}

inline std::string as_str(const pickle::value* v, const char* what) {
  if (v->type != pickle::kind::str) bad(v, std::string(what) + " must be a string");
  return v->text;
}

/// Slot `slot` of object node `call`, or nullptr: an object's element array holds only the
/// slots up to the last one an opcode filled (callable and args always).
inline const pickle::value* object_slot_of(const pickle::value* call, size_t slot) {
  return slot < call->items.size() ? call->items[slot] : nullptr;
}

inline const pickle::value* tuple_args(const pickle::value* call, size_t min, size_t max, const char* fn) {
  const pickle::value* args = call->items[pickle::kArgs];
  if (!args || args->type != pickle::kind::tuple) bad(call, std::string(fn) + ": arguments must be a tuple");
  if (args->items.size() < min || args->items.size() > max)
    bad(call, std::string(fn) + ": expected " + std::to_string(min) +
                  (min == max ? "" : "-" + std::to_string(max)) + " arguments, got " +
                  std::to_string(args->items.size()));
  return args;
}

}  // namespace ckpt::detail
