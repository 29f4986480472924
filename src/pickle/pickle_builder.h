// Internal: builds a value tree (ckpt/pickle.h) for pickle::write, node by node, the way
// torch.save's objects pickle: strings, integers, tuples, OrderedDicts, globals (each
// made once, so the writer memoizes them as CPython does) and REDUCE calls. Shared by
// the writers that make a torch.save archive from tensors (save_tensors, convert).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/pickle.h"

namespace ckpt::pickle {

struct builder {
  document doc;
  std::map<std::string, value*> globals;

  value* str(const std::string& s) {
    value* v = doc.make(kind::str, 0);
    v->text = s;
    return v;
  }
  value* integer(int64_t i) {
    value* v = doc.make(kind::integer, 0);
    v->integer = i;
    return v;
  }
  value* floating(double x) {
    value* v = doc.make(kind::floating, 0);
    v->floating = x;
    return v;
  }
  value* boolean(bool b) {
    value* v = doc.make(kind::boolean, 0);
    v->flag = b;
    return v;
  }
  value* tuple(std::vector<value*> items) {
    value* v = doc.make(kind::tuple, 0);
    v->items = std::move(items);
    return v;
  }
  /// A tuple of integers from any range of them (a shape, a stride).
  template <class Ints>
  value* ints(const Ints& xs) {
    std::vector<value*> items;
    for (int64_t x : xs) items.push_back(integer(x));
    return tuple(std::move(items));
  }
  value* global(const std::string& module, const std::string& name) {
    value*& g = globals[module + "\n" + name];
    if (!g) {
      g = doc.make(kind::global, 0);
      g->items = {str(module), str(name)};
    }
    return g;
  }
  value* ordered_dict() {
    value* d = doc.make(kind::dict, 0);
    d->flag = true;
    return d;
  }
  value* call(value* fn, value* args) {
    value* o = doc.make(kind::object, 0);
    o->op = object_op::reduce;
    o->items.assign(kObjectSlots, nullptr);
    o->items[kCallable] = fn;
    o->items[kArgs] = args;
    return o;
  }
};

}  // namespace ckpt::pickle
