#include "pickle/pickle_keys.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "pickle/pickle_text.h"
#include "base/text.h"

namespace ckpt::pickle::detail {
namespace {

bool unhashable(kind k) {
  return k == kind::list || k == kind::dict || k == kind::set || k == kind::bytearray;
}

}  // namespace

uint64_t key_table::intern(std::unordered_map<std::string, uint64_t>* table, std::string key) {
  auto [it, inserted] = table->try_emplace(std::move(key), next_);
  if (inserted) ++next_;
  return it->second;
}

uint64_t key_table::scalar_id(const value* v) {
  switch (v->type) {
    case kind::none:
      return 1;
    case kind::boolean:
    case kind::integer: {
      int64_t i = v->type == kind::boolean ? int64_t(v->flag) : v->integer;
      auto [it, inserted] = ints_.try_emplace(i, next_);
      if (inserted) ++next_;
      return it->second;
    }
    case kind::floating: {
      double d = v->floating;
      if (std::isnan(d)) {
        // NaN equals nothing, not even another NaN; only the same object finds itself.
        auto [it, inserted] = by_node_.try_emplace(v, next_);
        if (inserted) ++next_;
        return it->second;
      }
      if (std::isfinite(d) && d == std::trunc(d)) {
        if (d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
          auto [it, inserted] = ints_.try_emplace(int64_t(d), next_);
          if (inserted) ++next_;
          return it->second;
        }
        return intern(&others_, "I" + integral_double_to_twos(d));
      }
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      auto [it, inserted] = floats_.try_emplace(bits, next_);
      if (inserted) ++next_;
      return it->second;
    }
    case kind::big_integer:
      return intern(&others_, "I" + v->text);
    case kind::str: {
      auto [it, inserted] = strs_.try_emplace(v->text, next_);
      if (inserted) ++next_;
      return it->second;
    }
    case kind::bytes: {
      auto [it, inserted] = bytes_.try_emplace(v->text, next_);
      if (inserted) ++next_;
      return it->second;
    }
    case kind::global: {
      std::string key = "G";
      key += v->global_module();
      key += '\n';
      key += v->global_attr();
      return intern(&others_, std::move(key));
    }
    default: {
      // Objects and persistent ids hash by identity, as Python's default __hash__ does.
      auto [it, inserted] = by_node_.try_emplace(v, next_);
      if (inserted) ++next_;
      return it->second;
    }
  }
}

uint64_t key_table::composite_id(const value* root) {
  // Post-order over nested tuples/frozensets with an explicit stack: a key may nest as
  // deep as the input allows, and each tuple's id is cached, so shared sub-tuples (and
  // the same tuple inserted many times) cost nothing after the first time.
  struct frame {
    const value* node;
    size_t next;
    std::vector<uint64_t> ids;
  };
  std::vector<frame> stack;
  stack.push_back({root, 0, {}});
  while (true) {
    frame& f = stack.back();
    if (f.next < f.node->items.size()) {
      const value* child = f.node->items[f.next++];
      if (child->type == kind::tuple || child->type == kind::frozenset) {
        auto cached = by_node_.find(child);
        if (cached != by_node_.end()) {
          f.ids.push_back(cached->second);
        } else {
          stack.push_back({child, 0, {}});
        }
        continue;
      }
      if (unhashable(child->type)) {
        unhashable_ = text::python_type_name(child->type);
        return 0;
      }
      f.ids.push_back(scalar_id(child));
      continue;
    }
    std::string key(1, f.node->type == kind::tuple ? 'T' : 'F');
    if (f.node->type == kind::frozenset) {
      std::sort(f.ids.begin(), f.ids.end());
      f.ids.erase(std::unique(f.ids.begin(), f.ids.end()), f.ids.end());
    }
    key.append(reinterpret_cast<const char*>(f.ids.data()), f.ids.size() * sizeof(uint64_t));
    uint64_t id = intern(&others_, std::move(key));
    by_node_.emplace(f.node, id);
    stack.pop_back();
    if (stack.empty()) return id;
    stack.back().ids.push_back(id);
  }
}

uint64_t key_table::id(const value* key) {
  if (unhashable(key->type)) {
    unhashable_ = text::python_type_name(key->type);
    return 0;
  }
  if (key->type == kind::tuple || key->type == kind::frozenset) {
    auto cached = by_node_.find(key);
    if (cached != by_node_.end()) return cached->second;
    return composite_id(key);
  }
  return scalar_id(key);
}

bool key_table::equal(const value* a, const value* b) {
  if (a == b) return true;
  if (a->type == kind::str && b->type == kind::str) return a->text == b->text;
  if (a->type == kind::integer && b->type == kind::integer) return a->integer == b->integer;
  return id(a) == id(b);
}

}  // namespace ckpt::pickle::detail
