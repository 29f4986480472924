// Mirrors CPython 3.11's C pickler (Modules/_pickle.c) at protocol 2: which objects are
// memoized and in what order, batching by 1000, the exact-list/dict fast paths versus the
// generic __reduce__ item iterators, and fix_imports' Python 2 names.
#include "ckpt/pickle_writer.h"

#include <pthread.h>

#include <exception>
#include <memory>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/byteio.h"
#include "ckpt/error.h"
#include "pickle/pickle_names.h"
#include "pickle/pickle_opcodes.h"
#include "pickle/pickle_text.h"
#include "base/pointer_map.h"

namespace ckpt::pickle {
namespace {

constexpr size_t kBatchSize = 1000;  // pickle.py _BATCHSIZE
constexpr int kMaxWriteDepth = 10000;
// Virtual reservation for kMaxWriteDepth levels even in sanitizer builds; only touched pages
// cost memory.
constexpr size_t kWriterStackBytes = size_t(512) << 20;
constexpr size_t kMaxNameLinks = 100;  // dots in one global's qualified name

// Values CPython shares by itself (None, True, False, the small-int cache, the empty tuple):
// the reader keeps one node for each, and CPython never memoizes them, so neither does the
// writer, however often they appear.
bool never_memoized(const value* v) {
  switch (v->type) {
    case kind::none:
    case kind::boolean:
      return true;
    case kind::integer:
      return v->integer >= -5 && v->integer <= 256;
    case kind::tuple:
      return v->items.empty();
    default:
      return false;
  }
}

// Facts about nodes: for the document's own nodes in an array indexed by node id, for any
// other node in a pointer_map. A million tensors make millions of nodes, and a hash map
// keyed by address missed the cache on every probe and took 16 bytes a slot at half load:
// most of what writing their pickle cost in time and memory. `kNone` marks "no fact".
template <class V, V kNone>
class node_table {
 public:
  explicit node_table(const document* doc) : doc_(doc) {
    if (doc_) dense_.assign(doc_->node_count() + 1, kNone);
  }
  V* find(const value* v) {
    if (size_t i = index(v)) return dense_[i] == kNone ? nullptr : &dense_[i];
    return sparse_.find(v);
  }
  const V* find(const value* v) const { return const_cast<node_table*>(this)->find(v); }
  void set(const value* v, V x) {
    if (size_t i = index(v))
      dense_[i] = x;
    else
      sparse_.assign(v, x);
  }

 private:
  size_t index(const value* v) const {
    return doc_ && v->id < dense_.size() && doc_->owns(v) ? size_t(v->id) : 0;
  }
  const document* doc_;
  std::vector<V> dense_;
  ckpt::detail::pointer_map<V> sparse_;
};

// The memo index of each node written that can be met again. A node is written again only
// when a shared node (two places refer to it, or a cycle returns to it) is met while its
// first writing is still open: a tuple's elements and a reduce call's arguments come before
// its memo slot. So a node needs its index kept when it is shared or is written while a
// shared node is open; for most trees that is few nodes, kept in a pointer_map (an array
// of every node's index was 4 bytes a node, 36 MB at rekey's peak for a million tensors).
// Past one node in 16, the entries move to such an array, which then costs no more.
class memo_table {
 public:
  explicit memo_table(const document* doc) : doc_(doc) {}
  const uint32_t* find(const value* v) const {
    if (dense_) return dense_->find(v);
    return sparse_.find(v);
  }
  void set(const value* v, uint32_t idx) {
    if (dense_) return dense_->set(v, idx);
    sparse_.assign(v, idx);
    if (doc_ && sparse_.size() > doc_->node_count() / 16 + 4096) {
      dense_ = std::make_unique<node_table<uint32_t, UINT32_MAX>>(doc_);
      sparse_.for_each([this](const void* k, uint32_t i) { dense_->set(static_cast<const value*>(k), i); });
      sparse_ = ckpt::detail::pointer_map<uint32_t>();
    }
  }

 private:
  const document* doc_;
  ckpt::detail::pointer_map<uint32_t> sparse_;
  std::unique_ptr<node_table<uint32_t, UINT32_MAX>> dense_;
};

class writer {
 public:
  /// With a sink, the bytes go to it in pieces of about kPiece and run() returns nothing.
  writer(const document* doc, size_t expected_size, const byte_sink* sink = nullptr)
      : memo_(doc), refs_(doc), doc_(doc), expected_(sink ? kPiece + kPieceSlack : expected_size), sink_(sink) {}

  std::vector<uint8_t> run(const value* root) {
    count_shared(root);
    out_.reserve(std::max<size_t>(expected_, 4096));
    out_.push_back(op::PROTO);
    out_.push_back(2);
    save(root);
    out_.push_back(op::STOP);
    if (sink_) {
      pass_on();
      return {};
    }
    return std::move(out_);
  }
  uint64_t bytes_passed_on() const { return passed_on_; }

 private:
  // --- output ------------------------------------------------------------------------
  // With a sink the buffer is handed on once it holds a piece (wherever that falls: the
  // sink sees a byte stream); a long string may overrun it.
  static constexpr size_t kPiece = size_t(1) << 20;
  static constexpr size_t kPieceSlack = 64 << 10;
  void put(uint8_t b) {
    out_.push_back(b);
    if (sink_ && out_.size() >= kPiece) pass_on();
  }
  void put_bytes(std::string_view s) {
    out_.insert(out_.end(), s.begin(), s.end());
    if (sink_ && out_.size() >= kPiece) pass_on();
  }
  void put_u32(uint32_t v) {
    uint8_t b[4];
    store_u32(b, v);
    out_.insert(out_.end(), b, b + 4);
    if (sink_ && out_.size() >= kPiece) pass_on();
  }
  // Out of line: inlined into every put of save(), whose frame is one per nesting level,
  // it more than doubled that frame (kMaxWriteDepth levels must fit the writer's stack, and
  // under AddressSanitizer a throw from deeper than 64 MB of stack is not unwound cleanly).
  [[gnu::noinline]] void pass_on() {
    if (out_.empty()) return;
    (*sink_)(out_.data(), out_.size());
    passed_on_ += out_.size();
    out_.clear();
  }

  // --- memo --------------------------------------------------------------------------
  void put_memo_index(uint32_t idx) {
    if (idx < 256) {
      put(op::BINPUT);
      put(uint8_t(idx));
    } else {
      put(op::LONG_BINPUT);
      put_u32(idx);
    }
  }
  void get(uint32_t idx) {
    if (idx < 256) {
      put(op::BINGET);
      put(uint8_t(idx));
    } else {
      put(op::LONG_BINGET);
      put_u32(idx);
    }
  }
  // CPython memoizes objects that exist only while pickling (the args tuple of a bytes
  // reduction, say) like any other; they take an index that nothing fetches again.
  uint32_t memoize_fresh() {
    uint32_t idx = next_memo_++;
    put_memo_index(idx);
    return idx;
  }
  // Only a node that can be met again needs its index kept (see memo_table).
  void memoize(const value* v) {
    const uint32_t idx = memoize_fresh();
    if (open_shared_ > 0 || shared(v)) memo_.set(v, idx);
  }
  const uint32_t* memo_of(const value* v) const { return memo_.find(v); }
  // save_reduce's ending: the object may already be in the memo if saving its arguments
  // reached it through a cycle; then the fresh copy is dropped for the memoized one.
  void finish_reduce(const value* v) {
    if (const uint32_t* idx = memo_of(v)) {
      put(op::POP);
      get(*idx);
    } else {
      memoize(v);
    }
  }

  void count_shared(const value* root) {
    // Iterative, so the pre-pass cannot overflow the stack on a deep tree; save() has its
    // own depth guard.
    // Depth first, a frame per level holding where its children are (its items, then its
    // state): a stack of every pending child was 30 MB at rekey's peak for a dict of a
    // million tensors. Counting does not depend on the order. Every node is counted (a node
    // counted is one seen), for memo_of as well as for the immutable kinds' memo slots.
    struct frame {
      const value* node;
      size_t next;  // items[next], or the state when next == items.size()
    };
    std::vector<frame> todo{{root, 0}};
    bump(root);
    while (!todo.empty()) {
      frame& f = todo.back();
      const size_t n = f.node->items.size();
      if (f.next > n) {
        todo.pop_back();
        continue;
      }
      const value* child = f.next < n ? f.node->items[f.next] : f.node->state;
      ++f.next;
      if (!child) continue;
      const bool first = !refs_.find(child);
      bump(child);
      if (first) todo.push_back({child, 0});
    }
  }
  void bump(const value* v) {
    // Only "more than one" matters: the count stops at 2.
    if (uint8_t* n = refs_.find(v))
      *n = 2;
    else
      refs_.set(v, 1);
  }
  bool shared(const value* v) const {
    const uint8_t* n = refs_.find(v);
    return n && *n > 1;
  }

  // --- values ------------------------------------------------------------------------
  struct open_guard {
    explicit open_guard(int* n) : n(n) {
      if (n) ++*n;
    }
    ~open_guard() {
      if (n) --*n;
    }
    int* n;
  };
  struct depth_guard {
    explicit depth_guard(int* d) : depth(d) {
      if (++*depth > kMaxWriteDepth)
        throw_limit("value nested deeper than " + std::to_string(kMaxWriteDepth) +
                    " levels cannot be written");
    }
    ~depth_guard() { --*depth; }
    int* depth;
  };

  void save(const value* v) {
    if (!v) throw_unsupported("cannot write a missing value (null node)");
    depth_guard guard(&depth_);
    if (const uint32_t* idx = memo_of(v)) return get(*idx);
    const open_guard open(shared(v) ? &open_shared_ : nullptr);
    switch (v->type) {
      case kind::none:
        put(op::NONE);
        break;
      case kind::boolean:
        put(v->flag ? op::NEWTRUE : op::NEWFALSE);
        break;
      case kind::integer:
        save_int(v->integer);
        break;
      case kind::big_integer:
        save_long_bytes(v->text);
        break;
      case kind::floating:
        save_float(v->floating);
        break;
      case kind::str:
        save_str(v->text);
        memoize(v);
        return;
      case kind::bytes:
        return save_bytes(v);
      case kind::bytearray:
        return save_bytearray(v);
      case kind::tuple:
        return save_tuple(v);
      case kind::list:
        put(op::EMPTY_LIST);
        memoize(v);
        return batch_appends(v->items, true);
      case kind::dict:
        if (v->flag) return save_ordered_dict(v);
        put(op::EMPTY_DICT);
        memoize(v);
        return batch_setitems(v->items, true);
      case kind::set:
      case kind::frozenset:
        return save_set(v);
      case kind::global:
        // A literal dotted name goes out as it came in: at protocol 2 GLOBAL keeps its
        // meaning, while the getattr spelling would name nested attributes instead.
        if (v->flag) return save_literal_global(v->global_module(), v->global_attr());
        return save_global(v->global_module(), v->global_attr());
      case kind::object:
        return save_object(v);
      case kind::persistent_id:
        if (v->items.empty()) throw_unsupported("cannot write a persistent id without a pid");
        save(v->items[0]);
        put(op::BINPERSID);
        break;
    }
    // Kinds CPython never memoizes (immutable; identity does not matter to Python code) get
    // a memo slot only when the tree shares them, so sharing that a hand-made pickle
    // expressed survives, and CPython's own output is reproduced exactly.
    if (shared(v) && !never_memoized(v)) memoize(v);
  }

  void save_int(int64_t i) {
    if (i >= 0 && i <= 0xff) {
      put(op::BININT1);
      put(uint8_t(i));
    } else if (i >= 0 && i <= 0xffff) {
      put(op::BININT2);
      put(uint8_t(i));
      put(uint8_t(i >> 8));
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      put(op::BININT);
      put_u32(uint32_t(int32_t(i)));
    } else {
      save_long_bytes(detail::int64_to_twos(i));
    }
  }

  void save_long_bytes(std::string_view twos) {
    if (twos.size() < 256) {
      put(op::LONG1);
      put(uint8_t(twos.size()));
    } else {
      if (twos.size() > INT32_MAX) throw_unsupported("integer too large to pickle");
      put(op::LONG4);
      put_u32(uint32_t(twos.size()));
    }
    put_bytes(twos);
  }

  void save_float(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    put(op::BINFLOAT);
    for (int i = 7; i >= 0; --i) put(uint8_t(bits >> (8 * i)));  // big-endian
  }

  void save_str(std::string_view utf8) {
    // value::text already holds what CPython's 'surrogatepass' encoder produces.
    if (utf8.size() > UINT32_MAX)
      throw_unsupported("cannot write a string of 4 GiB or more with protocol 2");
    put(op::BINUNICODE);
    put_u32(uint32_t(utf8.size()));
    put_bytes(utf8);
  }

  // A constant str CPython keeps as one object (_Py_ID(latin1)), so it is memoized once.
  void save_constant_str(const char* s) {
    std::string key = std::string("\x01str:") + s;
    if (auto it = named_memo_.find(key); it != named_memo_.end()) return get(it->second);
    save_str(s);
    named_memo_[key] = memoize_fresh();
  }

  void save_global(std::string_view module_name, std::string_view attr) {
    for (const recent_global& r : recent_globals_)
      if (r.used && r.attr == attr && r.module == module_name) return get(r.idx);
    std::string key = std::string(module_name) + '\n' + std::string(attr);
    if (auto it = named_memo_.find(key); it != named_memo_.end()) {
      recent_global& r = recent_globals_[next_recent_++ % kRecentGlobals];
      r.module = module_name;
      r.attr = attr;
      r.idx = it->second;
      r.used = true;
      return get(it->second);
    }
    if (attr.find('.') == std::string_view::npos) return save_plain_global(module_name, attr, key);
    // Below protocol 4 a nested name a.b.c is spelled getattr(getattr(a, 'b'), 'c').
    // CPython recurses through the parents; this emits the same bytes in a loop: one
    // getattr per link not yet in the memo, the deepest memoized parent (or the top-level
    // name), then each link.
    std::vector<size_t> dots;
    for (size_t i = 0; i < attr.size(); ++i)
      if (attr[i] == '.') dots.push_back(i);
    // Every link is memoized under its own prefix, so the names cost quadratic memory.
    if (dots.size() > kMaxNameLinks)
      throw_unsupported("cannot write global '" + std::string(module_name) + "." +
                        std::string(attr.substr(0, 80)) + "...': nested more than " +
                        std::to_string(kMaxNameLinks) + " levels");
    // Link k appends the component after dots[k] to the prefix attr[0, dots[k]).
    auto prefix_key = [&](size_t end) {
      return std::string(module_name) + '\n' + std::string(attr.substr(0, end));
    };
    size_t base = 0;  // the first link to spell; its prefix is memoized when `found`
    bool found = false;
    for (size_t k = dots.size(); k-- > 0 && !found;) {
      if (named_memo_.count(prefix_key(dots[k]))) {
        base = k;
        found = true;
      }
    }
    for (size_t k = base; k < dots.size(); ++k) save_global("builtins", "getattr");
    if (found) {
      get(named_memo_[prefix_key(dots[base])]);
    } else {
      save_global(module_name, attr.substr(0, dots[0]));  // may be builtins.getattr itself
    }
    for (size_t k = base; k < dots.size(); ++k) {
      size_t end = k + 1 < dots.size() ? dots[k + 1] : attr.size();
      save_str(attr.substr(dots[k] + 1, end - dots[k] - 1));
      memoize_fresh();
      put(op::TUPLE2);
      memoize_fresh();
      put(op::REDUCE);
      named_memo_[prefix_key(end)] = memoize_fresh();
    }
  }

  void save_literal_global(std::string_view module_name, std::string_view attr) {
    std::string key = std::string(module_name) + "\n\x01literal\n" + std::string(attr);
    if (auto it = named_memo_.find(key); it != named_memo_.end()) return get(it->second);
    save_plain_global(module_name, attr, key);
  }

  void save_plain_global(std::string_view module_name, std::string_view attr,
                         const std::string& key) {
    std::string module(module_name), name(attr);
    detail::python3_to_2(&module, &name);
    // Every protocol-2 reader maps Python 2 names to Python 3 ones. A name that is
    // already Python 2 spelling (legal from protocol 3 on: "__builtin__.eval") would be
    // read back as a different global (builtins.eval), so it cannot be written.
    std::string back_module = module, back_name = name;
    detail::python2_to_3(&back_module, &back_name);
    if (back_module != module_name || back_name != attr)
      throw_unsupported("cannot write global '" + std::string(module_name) + "." + std::string(attr) +
                        "' in protocol 2: it would be read back as " + back_module + "." + back_name);
    auto bad = [](const std::string& s) {
      if (s.empty()) return true;
      for (char c : s)
        if (uint8_t(c) >= 0x80 || c == '\n') return true;
      return false;
    };
    if (bad(module) || bad(name))
      throw_unsupported("cannot write global '" + std::string(module_name) + "." +
                        std::string(attr) +
                        "' with protocol 2 (names must be non-empty ASCII, one line each)");
    put(op::GLOBAL);
    put_bytes(module);
    put('\n');
    put_bytes(name);
    put('\n');
    named_memo_[key] = memoize_fresh();
  }

  void save_tuple(const value* v) {
    const auto& items = v->items;
    size_t n = items.size();
    if (n == 0) {
      put(op::EMPTY_TUPLE);
      return;
    }
    if (n > 3) put(op::MARK);
    for (const value* item : items) save(item);
    // Saving the elements reached this tuple again (through a list or dict): drop what was
    // pushed and fetch the memoized tuple, as save_tuple does.
    if (const uint32_t* idx = memo_of(v)) {
      if (n > 3) {
        put(op::POP_MARK);
      } else {
        for (size_t i = 0; i < n; ++i) put(op::POP);
      }
      return get(*idx);
    }
    put(n == 1 ? op::TUPLE1 : n == 2 ? op::TUPLE2 : n == 3 ? op::TUPLE3 : op::TUPLE);
    memoize(v);
  }

  // bytes below protocol 3: _codecs.encode(latin-1 text, 'latin1'), or bytes() when empty.
  void save_bytes_reduction(std::string_view raw) {
    if (raw.empty()) {
      save_global("builtins", "bytes");
      put(op::EMPTY_TUPLE);
    } else {
      save_global("_codecs", "encode");
      save_str(detail::latin1_to_utf8(raw));
      memoize_fresh();
      save_constant_str("latin1");
      put(op::TUPLE2);
      memoize_fresh();
    }
    put(op::REDUCE);
  }

  void save_bytes(const value* v) {
    save_bytes_reduction(v->text);
    finish_reduce(v);
  }

  // bytearray.__reduce_ex__(2): (bytearray, (bytes(self),)), or (bytearray, ()) when empty.
  void save_bytearray(const value* v) {
    save_global("builtins", "bytearray");
    if (v->text.empty()) {
      put(op::EMPTY_TUPLE);
    } else {
      save_bytes_reduction(v->text);
      memoize_fresh();  // the temporary bytes object
      put(op::TUPLE1);
      memoize_fresh();
    }
    put(op::REDUCE);
    finish_reduce(v);
  }

  // set/frozenset below protocol 4: (set, ([items],)).
  void save_set(const value* v) {
    save_global("builtins", v->type == kind::set ? "set" : "frozenset");
    put(op::EMPTY_LIST);
    memoize_fresh();
    batch_appends(v->items, true);
    put(op::TUPLE1);
    memoize_fresh();
    put(op::REDUCE);
    finish_reduce(v);
  }

  // OrderedDict.__reduce__: (OrderedDict, (), state or None, None, iter(items)).
  void save_ordered_dict(const value* v) {
    save_global("collections", "OrderedDict");
    put(op::EMPTY_TUPLE);
    put(op::REDUCE);
    finish_reduce(v);
    batch_setitems(v->items, false);
    if (v->state) {
      save(v->state);
      put(op::BUILD);
    }
  }

  void save_object(const value* v) {
    auto slot = [&](size_t i) { return i < v->items.size() ? v->items[i] : nullptr; };
    const value* callable = slot(kCallable);
    const value* args = slot(kArgs);
    auto save_args = [&] {
      if (args) {
        save(args);
      } else {
        put(op::EMPTY_TUPLE);
      }
    };
    switch (v->op) {
      case object_op::reduce:
        save(callable);
        save_args();
        put(op::REDUCE);
        break;
      case object_op::newobj:
        save(callable);
        save_args();
        put(op::NEWOBJ);
        break;
      case object_op::newobj_ex:
        save(callable);
        save_args();
        if (const value* kwargs = slot(kKwargs)) {
          save(kwargs);
        } else {
          put(op::EMPTY_DICT);
        }
        put(op::NEWOBJ_EX);
        break;
      case object_op::inst:
      case object_op::obj:
        put(op::MARK);
        save(callable);
        if (args) {
          for (const value* a : args->items) save(a);
        }
        put(op::OBJ);
        break;
    }
    finish_reduce(v);
    if (const value* list = slot(kListItems)) batch_appends(list->items, false);
    if (const value* dict = slot(kDictItems)) batch_setitems(dict->items, false);
    if (v->state) {
      save(v->state);
      put(op::BUILD);
    }
  }

  // Items of an exact list/dict (batch_list_exact / batch_dict_exact): one item alone is
  // APPEND/SETITEM, otherwise every batch, even a last batch of one, is MARK ... APPENDS.
  // Items from a __reduce__ iterator (batch_list / batch_dict) end with APPEND/SETITEM when
  // the last batch holds a single item.
  void batch_appends(const item_list& items, bool exact) {
    size_t n = items.size();
    if (n == 0) return;
    if (n == 1) {
      save(items[0]);
      put(op::APPEND);
      return;
    }
    for (size_t start = 0; start < n; start += kBatchSize) {
      size_t end = std::min(n, start + kBatchSize);
      if (!exact && end - start == 1) {
        save(items[start]);
        put(op::APPEND);
        continue;
      }
      put(op::MARK);
      for (size_t i = start; i < end; ++i) save(items[i]);
      put(op::APPENDS);
    }
  }

  void batch_setitems(const item_list& kv, bool exact) {
    size_t n = kv.size() / 2;
    if (n == 0) return;
    if (n == 1) {
      save(kv[0]);
      save(kv[1]);
      put(op::SETITEM);
      return;
    }
    for (size_t start = 0; start < n; start += kBatchSize) {
      size_t end = std::min(n, start + kBatchSize);
      if (!exact && end - start == 1) {
        save(kv[2 * start]);
        save(kv[2 * start + 1]);
        put(op::SETITEM);
        continue;
      }
      put(op::MARK);
      for (size_t i = start; i < end; ++i) {
        save(kv[2 * i]);
        save(kv[2 * i + 1]);
      }
      put(op::SETITEMS);
    }
  }

  std::vector<uint8_t> out_;
  // Pointer-keyed maps without a node per entry: node-allocating hash maps were most of the
  // time of rewriting a pickle of a million tensors (rekey: 36 -> 19 CPU s). The memo holds
  // shared nodes only (see memoize), few enough for a pointer_map; the counts are one array.
  memo_table memo_;
  int open_shared_ = 0;  // shared nodes being written (see memo_table)
  std::unordered_map<std::string, uint32_t> named_memo_;  // globals and constants by name
  // Globals found in named_memo_ lately, found again without making their key: each
  // tensor's backward hooks (an OrderedDict) name collections.OrderedDict, a key made and
  // hashed a million times for a million tensors. A name's memo index never changes.
  static constexpr size_t kRecentGlobals = 4;
  struct recent_global {
    std::string module, attr;
    uint32_t idx = 0;
    bool used = false;
  };
  recent_global recent_globals_[kRecentGlobals];
  size_t next_recent_ = 0;
  node_table<uint8_t, 0> refs_;
  const document* doc_;
  size_t expected_;
  const byte_sink* sink_;
  uint64_t passed_on_ = 0;
  uint32_t next_memo_ = 0;
  int depth_ = 0;
};

}  // namespace

namespace {

// Runs the writer on `root`, into `out` or, with a sink, into the sink; returns the bytes.
uint64_t write_any(const value* root, int protocol, const document* owner, size_t expected_size,
                   std::vector<uint8_t>* out, const byte_sink* sink) {
  if (protocol != 2)
    throw_unsupported("pickle protocol " + std::to_string(protocol) +
                      " cannot be written (only protocol 2, torch.save's)");
  if (!root) throw_unsupported("cannot write an empty document");
  // The writer recurses once per nesting level, up to kMaxWriteDepth. Frame sizes differ a lot
  // between builds (sanitizers triple them), so it runs on a thread whose stack is sized
  // for the limit, not on whatever stack the caller happens to have.
  std::exception_ptr failure;
  uint64_t written = 0;
  struct job {
    const value* root;
    const document* doc;
    size_t expected_size;
    std::vector<uint8_t>* out;
    const byte_sink* sink;
    uint64_t* written;
    std::exception_ptr* failure;
  } j{root, owner, expected_size, out, sink, &written, &failure};
  auto body = [](void* arg) -> void* {
    auto* jp = static_cast<job*>(arg);
    try {
      writer w(jp->doc, jp->expected_size, jp->sink);
      if (jp->sink) {
        w.run(jp->root);
        *jp->written = w.bytes_passed_on();
      } else {
        *jp->out = w.run(jp->root);
        *jp->written = jp->out->size();
      }
    } catch (...) {
      *jp->failure = std::current_exception();
    }
    return nullptr;
  };
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kWriterStackBytes);
  pthread_t thread;
  int rc = pthread_create(&thread, &attr, body, &j);
  pthread_attr_destroy(&attr);
  // Without that thread, kMaxWriteDepth levels of recursion could overflow whatever stack the
  // caller has: refuse rather than risk it.
  if (rc != 0)
    throw error(errc::io, std::string("cannot start the pickle writer's thread: ") + std::strerror(rc));
  pthread_join(thread, nullptr);
  if (failure) std::rethrow_exception(failure);
  return written;
}

}  // namespace

std::vector<uint8_t> write(const value* root, int protocol, const document* owner, size_t expected_size) {
  std::vector<uint8_t> out;
  write_any(root, protocol, owner, expected_size, &out, nullptr);
  return out;
}

uint64_t write_to(const byte_sink& sink, const value* root, int protocol, const document* owner) {
  return write_any(root, protocol, owner, 0, nullptr, &sink);
}

}  // namespace ckpt::pickle
