// A restricted pickle machine: it decodes every opcode of protocols 0-5 with CPython's
// semantics into a value tree, and never imports or calls anything.
//
// A GLOBAL is only a name. Calling it (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ) makes an
// `object` node that records the callable, its arguments, and whatever BUILD, SETITEM(S),
// APPEND(S) later did to it. A few constructors whose meaning is pure data are folded into
// plain values, because that is what they are to every reader and writer of the format:
//   collections.OrderedDict()         -> dict (ordered = true; BUILD state kept in `state`)
//   OrderedDict / dict (pairs or dict) -> dict (Python 2's OrderedDict.__reduce__)
//   builtins.list / tuple (sequence)  -> list / tuple
//   copyreg._reconstructor(cls, object | dict | list, state), copyreg.__newobj__(cls, ...)
//                                     -> what NEWOBJ (plus SETITEMS / APPENDS) makes of cls
//   builtins.set / frozenset (list)   -> set / frozenset
//   _codecs.encode(str, 'latin1')     -> bytes (how protocol 2 spells bytes)
//   builtins.bytes() / bytearray(b)   -> bytes / bytearray
// Python 2 module names are mapped to Python 3 ones as CPython's _compat_pickle does.
//
// The tree is a DAG: memo references (GET) share nodes, exactly as they share objects in
// Python, and a pickle can even build cycles. Every traversal must track visited nodes.
// Nodes live in a `document` arena and are referred to by plain pointers that stay valid
// for the document's lifetime.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/pickle_items.h"
#include "ckpt/pickle_node_text.h"

namespace ckpt::pickle {

enum class kind : uint8_t {
  none, boolean, integer, big_integer, floating, str, bytes, bytearray,
  tuple, list, dict, set, frozenset,
  global,          // items = {str module, str name}
  object,          // see object_slot
  persistent_id,   // items = {pid}; from PERSID / BINPERSID
};

/// How an object node was made.
enum class object_op : uint8_t { reduce, newobj, newobj_ex, inst, obj };

/// Slots of items[] for kind::object. Absent slots hold nullptr.
enum object_slot : size_t {
  kCallable = 0,   // a global node (or whatever value was called)
  kArgs = 1,       // a tuple node
  kKwargs = 2,     // NEWOBJ_EX only: a dict node
  kListItems = 3,  // a list node collecting APPEND/APPENDS made on the object
  kDictItems = 4,  // a dict node collecting SETITEM/SETITEMS made on the object
  kObjectSlots = 5,
};

// 48 bytes (tests/unit/pickle_test.cpp measures it): the machine's memory is about this
// per decoded value, plus the text and elements it holds, which is what limits::max_values
// multiplies. `text` and `items` share their 16 bytes (no node has both; the one not in
// use reads as empty): a torch.save tensor is 7 nodes, so this was 112 bytes a tensor.
struct value {
  value() : offset(0), items() {}
  value(const value&) = delete;
  value& operator=(const value&) = delete;
  ~value() { items.~item_list(); }  // frees what the shared bytes own, text or elements

  kind type = kind::none;
  bool flag = false;      // boolean: the value; dict: true for collections.OrderedDict;
                          // global: a dotted name read below protocol 4, which names one
                          // attribute with dots in it, not nested ones
  object_op op = object_op::reduce;
  // Stream offset of the opcode that made this node, in the 40 bits left of the first
  // word (1 TiB; document::make saturates larger ones).
  uint64_t offset : 40;
  union {
    int64_t integer = 0;  // integer (the reader keeps nesting heights here while it runs)
    double floating;      // floating
  };
  union {
    // tuple/list/set/frozenset: elements; dict: k0, v0, k1, v1, ... in insertion order;
    // global, object, persistent_id: see above.
    item_list items;
    // str: UTF-8 (lone surrogates kept as WTF-8, as CPython's surrogatepass would);
    // bytes/bytearray: raw bytes; big_integer: two's complement, little-endian, minimal.
    node_text text;
  };
  value* state = nullptr;  // BUILD state (objects, OrderedDict)
  // Its number in the document that made it (1, 2, ...; see document::node), so that a
  // walk over millions of nodes can keep per-node facts in plain arrays; 0 for a node made
  // elsewhere (or past 2^32 nodes).
  uint32_t id = 0;

  size_t dict_size() const { return items.size() / 2; }
  value* dict_key(size_t i) const { return items[2 * i]; }
  value* dict_value(size_t i) const { return items[2 * i + 1]; }
  /// For global nodes: "module.name" (the spelling weights_only error messages use).
  std::string global_name() const;
  std::string_view global_module() const { return items[0]->text; }
  std::string_view global_attr() const { return items[1]->text; }
  bool is_global(std::string_view module, std::string_view name) const {
    return type == kind::global && global_module() == module && global_attr() == name;
  }
  /// For object nodes: the callable, if it is a global (else nullptr).
  const value* callable_global() const;
};

/// Resource limits; every one can be raised from the command line. Defaults are generous
/// for real checkpoints (tens of thousands of tensors) and still bound memory and time.
struct limits {
  uint64_t max_pickle_bytes = 1ull << 30;   // the size of data.pkl we agree to parse
  uint64_t max_depth = 1000;                // MARK nesting and container nesting
  uint64_t max_stack = 10'000'000;          // values on the stack at once
  uint64_t max_memo = 50'000'000;           // memo entries
  uint64_t max_container = 100'000'000;     // elements of one container
  uint64_t max_string = 1ull << 30;         // one str/bytes operand
  uint64_t max_long_bytes = 1u << 16;       // LONG1/LONG4/text LONG operand
  // Values decoded: every node made plus every element put in a container (and any room a
  // SETITEMS reserved for pairs that repeated keys left unused). None, True,
  // False, the ints -5..256 and the empty tuple are made once and cost nothing after.
  // This is what bounds the reader's memory: a value costs at most about 80 bytes (a node
  // is 48 bytes in its block of the document; an element 8-16 bytes; a new dict key with
  // its index and hash entries about 60 per value it counts; text is bounded by the input's
  // size), so the default keeps the machine under about 3.6 GiB whatever the input
  // (measured with 72-byte nodes: 50 M popped dicts, 75 bytes each). A torch.save checkpoint needs 30 values per 1-D tensor, 34 per 2-D one:
  // 1,000,000 tensors fit. The tensor collector counts the paths it stores against the
  // same number (one value per step, ~40 bytes), separately.
  uint64_t max_values = 48'000'000;
};

/// Owns every node of one decoded pickle, and the text and element arrays the pickle
/// machine gave them: nodes in fixed blocks (their addresses never change), text and
/// arrays in one bump arena, so a million tensors cost a few large allocations instead of
/// millions of small ones, and freeing the document costs about nothing per node.
class document {
 public:
  document() = default;
  document(document&& o) noexcept;
  document& operator=(document&& o) noexcept;
  document(const document&) = delete;
  document& operator=(const document&) = delete;
  ~document();

  value* make(kind type, uint64_t offset);
  value* root = nullptr;
  /// Highest protocol announced by PROTO (0 when there was none).
  int protocol = 0;
  /// Offset just past the STOP opcode, relative to the start of the parsed bytes. Several
  /// pickles can follow each other in one stream (the legacy torch.save format does this).
  uint64_t end_offset = 0;
  size_t node_count() const { return count_; }
  /// The node whose value::id is `id`, or nullptr when this document made none.
  const value* node(uint64_t id) const {
    if (id == 0 || id > count_) return nullptr;
    return &blocks_[size_t((id - 1) >> kBlockShift)][size_t((id - 1) & (kBlockNodes - 1))];
  }
  /// True when `v` is a node of this document (its id leads back to it).
  bool owns(const value* v) const { return v && node(v->id) == v; }

  /// A copy of `s` that lives as long as the document: for node text (value::text.borrow).
  std::string_view keep(std::string_view s);
  /// Room for `n` element pointers that lives as long as the document (item_list::borrow).
  value** keep_items(size_t n);

  class node_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = value;
    using difference_type = std::ptrdiff_t;
    using pointer = const value*;
    using reference = const value&;
    node_iterator(const document* d, size_t i) : d_(d), i_(i) {}
    reference operator*() const { return *d_->node(i_ + 1); }
    pointer operator->() const { return d_->node(i_ + 1); }
    node_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const node_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const node_iterator& o) const { return i_ != o.i_; }

   private:
    const document* d_;
    size_t i_;
  };
  struct node_range {
    node_iterator b, e;
    node_iterator begin() const { return b; }
    node_iterator end() const { return e; }
  };
  /// Every node ever made, reachable from root or not: a global that was called and then
  /// popped off the stack still ran under CPython, so safety scans must see them all.
  node_range nodes() const { return {node_iterator(this, 0), node_iterator(this, count_)}; }

 private:
  static constexpr unsigned kBlockShift = 12;
  static constexpr size_t kBlockNodes = size_t(1) << kBlockShift;  // 256 KiB of nodes
  void destroy();
  // Empty again without freeing anything: what was held now belongs to another document.
  void forget();

  std::vector<value*> blocks_;
  size_t count_ = 0;
  // The arena: chunks of raw bytes, filled from the front.
  std::vector<char*> chunks_;
  char* arena_next_ = nullptr;
  size_t arena_left_ = 0;
  void* arena_alloc(size_t bytes, size_t align);
};

struct parse_options {
  limits lim;
  /// Added to every offset in errors and in value::offset, so they are file offsets.
  uint64_t base_offset = 0;
  /// Require that STOP is the last byte (true for data.pkl; false when pickles are stacked).
  bool require_eof = true;
  /// When set, receives "module.name" of every global as it is met, so a caller can still
  /// name what a pickle imports when the pickle breaks later: CPython would already have
  /// imported (and maybe run) those before reaching the break (security.md P5).
  std::vector<std::string>* globals_seen = nullptr;
};

/// Decodes one pickle from `data`. Throws ckpt::error (corrupt / unsupported / limit) with
/// the file offset of the offending opcode. Nothing from the input is ever executed.
document parse(const uint8_t* data, size_t size, const parse_options& options = {});

/// Python-like rendering for humans and reports ("OrderedDict", "'abc'", "torch.float32").
/// Bounded: deep or huge values are elided with "...".
std::string repr(const value* v, size_t max_chars = 200);

}  // namespace ckpt::pickle
