// The restricted pickle machine: CPython's Lib/pickle.py _Unpickler, opcode for opcode, with
// every call replaced by a record of the call (see ckpt/pickle.h) and every size checked
// against the input and the configured limits before anything is allocated.
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/byteio.h"
#include "ckpt/error.h"
#include "ckpt/pickle.h"
#include "pickle/pickle_keys.h"
#include "pickle/pickle_names.h"
#include "pickle/pickle_opcodes.h"
#include "pickle/pickle_text.h"
#include "base/text.h"

namespace ckpt::pickle {

namespace {

using detail::python_int;

// Containers smaller than this find repeated keys by a linear scan; larger ones get a hash
// index, so a 20,000-entry state dict stays linear.
constexpr size_t kIndexThreshold = 16;

// Operand text quoted for an error message: short, one line, no raw control bytes.
std::string quoted(std::string_view s) { return text::quote(s, 40); }

const char* kind_name(kind k) { return text::python_type_name(k); }

bool ascii_only(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return uint8_t(c) < 0x80; });
}

bool is_latin1_name(std::string_view s) {
  std::string lower(s);
  for (char& c : lower) c = char(c >= 'A' && c <= 'Z' ? c + 32 : c);
  return lower == "latin1" || lower == "latin-1" || lower == "latin_1" || lower == "iso-8859-1" ||
         lower == "iso8859-1";
}

// The memo: dense while keys are small and packed (every pickler writes 0, 1, 2, ...),
// sparse for anything else, so a LONG_BINPUT of 4e9 costs one hash entry, not 32 GB.
class memo_table {
 public:
  value* get(uint64_t key) const {
    if (key < dense_.size() && dense_[key]) return dense_[key];
    if (sparse_.empty()) return nullptr;
    auto it = sparse_.find(key);
    return it == sparse_.end() ? nullptr : it->second;
  }
  bool contains(uint64_t key) const { return get(key) != nullptr; }
  void put(uint64_t key, value* v) {
    if (!sparse_.empty()) {
      auto it = sparse_.find(key);
      if (it != sparse_.end()) {
        it->second = v;
        return;
      }
    }
    if (key < dense_.size()) {
      if (!dense_[key]) ++count_;
      dense_[key] = v;
      return;
    }
    if (key <= 2 * count_ + 4096) {
      dense_.resize(std::max<uint64_t>(key + 1, dense_.size() * 2), nullptr);
      dense_[key] = v;
    } else {
      sparse_.emplace(key, v);
    }
    ++count_;
  }
  uint64_t size() const { return count_; }
  // Room only (no entry, no page touched): the dense array then grows in place.
  void reserve(size_t n) { dense_.reserve(n); }

 private:
  std::vector<value*> dense_;
  std::unordered_map<uint64_t, value*> sparse_;
  uint64_t count_ = 0;
};

bool is_container(kind k) {
  switch (k) {
    case kind::tuple:
    case kind::list:
    case kind::dict:
    case kind::set:
    case kind::frozenset:
    case kind::object:
    case kind::persistent_id:
      return true;
    default:
      return false;
  }
}

// Index of one large dict or set: open addressing over positions in the container, so the
// keys themselves are never copied. Each slot holds (32-bit hash << 32) | (position + 1).
class container_index {
 public:
  // The position of a key equal to the probed one (`same(pos)` decides), or -1 after
  // recording `pos` for it.
  template <class Same>
  long find_or_add(uint64_t hash, uint32_t pos, Same same) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    uint32_t h32 = uint32_t(hash >> 32);
    size_t mask = slots_.size() - 1;
    for (size_t i = h32 & mask;; i = (i + 1) & mask) {
      uint64_t s = slots_[i];
      if (s == 0) {
        slots_[i] = (uint64_t(h32) << 32) | (uint64_t(pos) + 1);
        ++count_;
        return -1;
      }
      if (uint32_t(s >> 32) == h32 && same(uint32_t(s) - 1)) return long(uint32_t(s) - 1);
    }
  }

 private:
  void grow() {
    std::vector<uint64_t> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, 0);
    size_t mask = slots_.size() - 1;
    for (uint64_t s : old) {
      if (!s) continue;
      size_t i = uint32_t(s >> 32) & mask;
      while (slots_[i]) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<uint64_t> slots_;
  size_t count_ = 0;
};

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

class machine {
 public:
  machine(const uint8_t* data, size_t size, const parse_options& options)
      : data_(data), size_(size), options_(options), lim_(options.lim), limit_(size) {
    // Writers memoize nearly every value they write (a DCP .metadata: 2.5 M entries in
    // 17 MB), at 2 bytes or more each; reserved up front, the memo is never copied as it
    // doubles (4% of parsing such a file).
    memo_.reserve(size_t(std::min<uint64_t>({size / 4, lim_.max_memo, uint64_t(1) << 24})));
  }

  document run();

 private:
  // --- errors ------------------------------------------------------------------------
  uint64_t where() const { return options_.base_offset + op_pos_; }
  std::string op_name() const {
    const char* n = op::name(code_);
    return n ? n : "opcode";
  }
  [[noreturn]] void corrupt(const std::string& message) const {
    throw_corrupt(op_name() + ": " + message, where());
  }
  [[noreturn]] void unsupported(const std::string& message) const {
    throw_unsupported(op_name() + ": " + message, where());
  }
  [[noreturn]] void over_limit(const std::string& what, uint64_t limit, const char* flag) const {
    throw_limit(what + " " + std::to_string(limit) + " (raise with " + flag + ")", where());
  }
  [[noreturn]] void underflow() const {
    bool blocked = !marks_.empty() && stack_.size() == marks_.back() && marks_.back() > 0;
    corrupt(blocked ? "stack underflow (nothing above the last MARK)" : "stack underflow");
  }
  [[noreturn]] void wrong_target(const value* target) const {
    // A global or a persistent object is something CPython would call a method on:
    // possibly valid, but outside what a data reader can honour.
    if (target->type == kind::global || target->type == kind::persistent_id)
      unsupported(std::string("applied to a ") + kind_name(target->type) +
                  ", which would run its code");
    std::string name = kind_name(target->type);
    corrupt(std::string("applied to a") + (name[0] == 'i' || name[0] == 'o' ? "n " : " ") + name);
  }

  // --- input -------------------------------------------------------------------------
  // Inside a FRAME, limit_ is the frame's end: an operand that reaches past it is an error
  // (security.md P4), never silently read from beyond the frame.
  [[noreturn]] void truncated(uint64_t need) const {
    if (in_frame_)
      corrupt("operand runs past the end of its FRAME (needs " + std::to_string(need) + " bytes, " +
              std::to_string(limit_ - pos_) + " left in the frame)");
    corrupt("truncated pickle (operand needs " + std::to_string(need) + " bytes, " +
            std::to_string(limit_ - pos_) + " left)");
  }
  const uint8_t* take(uint64_t n) {
    if (n > limit_ - pos_) truncated(n);
    const uint8_t* p = data_ + pos_;
    pos_ += size_t(n);
    return p;
  }
  uint8_t take_u8() { return *take(1); }
  std::string_view take_string(uint64_t n) {
    if (n > limit_ - pos_) truncated(n);
    if (n > lim_.max_string)
      over_limit("string operand longer than", lim_.max_string, "--max-string");
    return {reinterpret_cast<const char*>(take(n)), size_t(n)};
  }
  std::string_view line() {
    const uint8_t* start = data_ + pos_;
    const void* nl = std::memchr(start, '\n', limit_ - pos_);
    if (!nl) {
      if (in_frame_) corrupt("text operand runs past the end of its FRAME");
      corrupt("truncated pickle (text operand has no end of line)");
    }
    size_t n = size_t(static_cast<const uint8_t*>(nl) - start);
    pos_ += n + 1;
    return {reinterpret_cast<const char*>(start), n};
  }

  // --- stack -------------------------------------------------------------------------
  size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(value* v) {
    if (stack_.size() >= lim_.max_stack)
      over_limit("pickle stack holds more than", lim_.max_stack, "--max-stack");
    stack_.push_back(v);
  }
  value* pop() {
    if (stack_.size() <= fence()) underflow();
    value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  value* top() const {
    if (stack_.size() <= fence()) underflow();
    return stack_.back();
  }
  void need(size_t n) const {
    if (stack_.size() - fence() < n) underflow();
  }
  // Position of the first item above the last MARK; the caller drops the items and mark.
  size_t pop_mark() {
    if (marks_.empty()) corrupt("no MARK on the stack");
    size_t k = marks_.back();
    marks_.pop_back();
    return k;
  }
  // The object below a MARK that APPENDS / SETITEMS / ADDITEMS modify.
  value* target_below(size_t k) const {
    if (k <= fence()) underflow();
    return stack_[k - 1];
  }
  void check_container(size_t n) const {
    // Container indexes hold 32-bit positions, whatever the configured limit.
    uint64_t cap = std::min<uint64_t>(lim_.max_container, 0xFFFFFFF0u);
    if (n > cap) over_limit("container with more elements than", cap, "--max-container");
  }

  // --- values ------------------------------------------------------------------------
  value* make(kind k) {
    charge(1);
    value* v = doc_.make(k, where());
    if (is_container(k)) v->integer = 1;  // nesting height, see link()
    return v;
  }
  // Every node made and every element put in a container counts against max_values, which
  // is what bounds the machine's memory (see limits::max_values).
  void charge(uint64_t n) {
    values_ += n;
    if (values_ > lim_.max_values)
      over_limit("pickle decodes more values than", lim_.max_values, "--max-values");
  }
  // Immutable values CPython itself shares (None, True, False, the small-int cache, the
  // empty tuple) are one node each, so the 1-byte opcodes that make them cost no memory.
  // Their offset is where the first one was made.
  value* singleton(value** slot, kind k) {
    if (!*slot) *slot = make(k);
    return *slot;
  }
  value* make_none() { return singleton(&none_, kind::none); }
  value* make_bool(bool b) {
    value** slot = b ? &true_ : &false_;
    if (!*slot) {
      *slot = make(kind::boolean);
      (*slot)->flag = b;
    }
    return *slot;
  }
  value* make_empty_tuple() { return singleton(&empty_tuple_, kind::tuple); }
  value* make_small(int64_t i) {
    bool cached = i >= kSmallIntMin && i <= kSmallIntMax;
    if (cached && small_ints_[i - kSmallIntMin]) return small_ints_[i - kSmallIntMin];
    value* v = make(kind::integer);
    v->integer = i;
    if (cached) small_ints_[i - kSmallIntMin] = v;
    return v;
  }
  // Text and element arrays go to the document's arena: one bump allocation each instead
  // of a heap block per node (a million tensors make millions of them).
  void set_text(value* v, std::string_view text) { v->text.borrow(doc_.keep(text)); }
  void set_items(value* v, value* const* first, size_t n) {
    value** room = doc_.keep_items(n);
    if (n) std::copy(first, first + n, room);
    v->items.borrow(room, n);
  }
  void set_items(value* v, std::initializer_list<value*> items) { set_items(v, items.begin(), items.size()); }
  value* make_str(std::string_view text) {
    value* v = make(kind::str);
    set_text(v, text);
    return v;
  }
  value* make_int(const python_int& i) {
    if (i.is_small) return make_small(i.small);
    value* v = make(kind::big_integer);
    set_text(v, i.big);
    return v;
  }
  value* make_long(std::string_view twos) {
    python_int i;
    if (detail::twos_to_int64(twos, &i.small)) return make_int(i);
    i.is_small = false;
    i.big = std::string(twos);
    detail::minimize_twos(&i.big);
    return make_int(i);
  }
  python_int parse_int(std::string_view text, bool with_prefixes, size_t max_bytes) {
    python_int out;
    switch (detail::parse_int_literal(text, with_prefixes, max_bytes, &out)) {
      case detail::int_parse::ok:
        return out;
      case detail::int_parse::invalid:
        corrupt("invalid integer literal " + quoted(text));
      case detail::int_parse::too_many_digits:
        unsupported("integer literal with more than 4300 digits (CPython refuses it too)");
      case detail::int_parse::too_large:
        over_limit("integer longer in bytes than", max_bytes, "--max-long-bytes");
    }
    return out;
  }
  // Python 2 str (STRING, BINSTRING, SHORT_BINSTRING). CPython's default decodes these as
  // ASCII and fails otherwise; torch.load passes encoding="utf-8". We take valid UTF-8 as
  // str (a superset of both) and keep anything else as bytes, which is what
  // encoding="bytes" would give, rather than inventing characters with latin-1.
  value* make_py2_string(std::string_view raw) {
    value* v = make(detail::valid_utf8(raw, false) ? kind::str : kind::bytes);
    set_text(v, raw);
    return v;
  }
  value* make_global(std::string module, std::string name);
  value* make_object(object_op how, value* callable, value* args) {
    value* v = make(kind::object);
    v->op = how;
    charge(kObjectSlots);  // the bound counts every slot an object may come to fill
    // Only the slots every object fills: the others are added when an opcode first needs
    // them (a million tensor rebuild calls use none of them: 24 bytes each saved).
    set_items(v, {callable, args});
    link(v, callable);
    link(v, args);
    return v;
  }
  value* call(object_op how, value* callable, value* args);
  value* fold_data_constructor(const value* callable, const value* args);
  // Python 2 and protocols 0-1 spell containers and objects as calls (see call()).
  value* copyreg_call(const value* callable, value* args);
  value* copy_pairs(value* into, const value* src, const char* who);
  value* copy_items(value* into, const value* src);
  // The list/dict that records APPEND/SETITEM calls on an object. Its height is folded
  // into the object's by grow_owner(), so filling it is not a mutation "after nesting".
  value* object_slot(value* obj, size_t slot, kind k) {
    if (obj->items.size() <= slot) obj->items.resize(slot + 1, nullptr);
    if (!obj->items[slot]) {
      obj->items[slot] = make(k);
      grow(obj, 2);
    }
    return obj->items[slot];
  }
  void grow_owner(value* obj, const value* slot) { grow(obj, height(slot) + 1); }

  // --- nesting depth ------------------------------------------------------------------
  // Every container keeps its nesting height in `integer` while the machine runs (reset
  // before parse returns): 1 + the height of its deepest container child, updated by link()
  // as edges appear. As long as no container gains a deeper child after it was itself put
  // inside another (true of everything CPython's pickler writes, cycles aside), these
  // heights are exact and max_depth is enforced at the opcode that breaks it, at O(1) per
  // edge. Otherwise (`late_`), a full pass over the finished graph decides.
  static constexpr int64_t kNested = int64_t(1) << 40;
  static uint32_t height(const value* v) { return uint32_t(v->integer & 0xFFFFFFFF); }
  void grow(value* parent, uint64_t h) {
    if (late_ || h <= height(parent)) return;
    if (parent->integer & kNested) {
      late_ = true;
      return;
    }
    if (h > lim_.max_depth) too_deep(where());
    parent->integer = (parent->integer & ~int64_t(0xFFFFFFFF)) | int64_t(h);
  }
  void link(value* parent, value* child) {
    if (!is_container(child->type)) return;
    if (child == parent) {
      late_ = true;
      return;
    }
    child->integer |= kNested;
    grow(parent, uint64_t(height(child)) + 1);
  }
  [[noreturn]] void too_deep(uint64_t offset) const {
    throw_limit("pickle nesting deeper than " + std::to_string(lim_.max_depth) +
                    " (raise with --max-depth)",
                offset);
  }

  // --- container semantics -----------------------------------------------------------
  uint64_t key_id(const value* key) {
    uint64_t id = keys_.id(key);
    if (id == 0) corrupt(std::string("unhashable type: '") + keys_.unhashable_type() + "'");
    return id;
  }
  // Scalars are always hashable; containers need a look (a tuple may hold a list).
  void check_hashable(const value* key) {
    switch (key->type) {
      case kind::tuple:
      case kind::frozenset:
      case kind::list:
      case kind::dict:
      case kind::set:
      case kind::bytearray:
        key_id(key);
        return;
      default:
        return;
    }
  }
  void dict_set(value* d, value* key, value* val);
  void set_add(value* s, value* item);
  void append(value* target, value* item);
  void extend(value* target, size_t from);
  value* dict_target(value* target, value** owner);
  long index_find_or_add(value* container, const value* key, uint32_t pos);
  void build(value* inst, value* state);
  bool falsy(const value* v) const;

  // --- opcodes -----------------------------------------------------------------------
  void step();
  void load_collection(kind k);
  void load_frame();
  void memo_put(uint64_t key) {
    value* v = top();
    if (!memo_.contains(key) && memo_.size() >= lim_.max_memo)
      over_limit("memo holds more entries than", lim_.max_memo, "--max-memo");
    memo_.put(key, v);
  }
  void memo_get(uint64_t key) {
    value* v = memo_.get(key);
    if (!v) corrupt("memo key " + std::to_string(key) + " was never stored");
    push(v);
  }
  uint64_t text_memo_key(bool for_put);
  void check_depth(const value* root);
  void clear_scratch() {
    for (const value& v : doc_.nodes())
      if (is_container(v.type)) const_cast<value&>(v).integer = 0;
  }

  const uint8_t* data_;
  size_t size_;
  const parse_options& options_;
  const limits& lim_;
  size_t pos_ = 0;
  size_t limit_;
  bool in_frame_ = false;
  size_t op_pos_ = 0;
  uint8_t code_ = 0;
  int proto_ = 0;
  bool stopped_ = false;

  document doc_;
  std::vector<value*> stack_;
  std::vector<size_t> marks_;
  memo_table memo_;
  detail::key_table keys_;
  std::unordered_map<const value*, container_index> indexes_;
  const value* indexed_ = nullptr;  // the container index_ belongs to
  container_index* index_ = nullptr;
  bool late_ = false;
  uint64_t values_ = 0;
  static constexpr int64_t kSmallIntMin = -5, kSmallIntMax = 256;  // CPython's small ints
  value* none_ = nullptr;
  value* true_ = nullptr;
  value* false_ = nullptr;
  value* empty_tuple_ = nullptr;
  value* small_ints_[kSmallIntMax - kSmallIntMin + 1] = {};
};

value* machine::make_global(std::string module, std::string name) {
  // CPython's find_class applies _compat_pickle only below protocol 3, where Python 2
  // names are legal; torch's UnpicklerWrapper always maps its moved module.
  if (proto_ < 3) detail::python2_to_3(&module, &name);
  if (module == "torch.tensor") module = "torch._tensor";
  if (options_.globals_seen) options_.globals_seen->push_back(module + "." + name);
  value* g = make(kind::global);
  // CPython resolves a dotted name as nested attributes from protocol 4 on, and below it
  // as one attribute whose name holds the dots: the writer must know which it was.
  g->flag = proto_ < 4 && name.find('.') != std::string::npos;
  charge(2);
  set_items(g, {make_str(module), make_str(name)});
  return g;
}

value* machine::fold_data_constructor(const value* callable, const value* args) {
  if (callable->type != kind::global) return nullptr;
  std::string_view module = callable->global_module(), name = callable->global_attr();
  const item_list& a = args->items;
  if ((module == "collections" && name == "OrderedDict") || (module == "builtins" && name == "dict")) {
    // Python 2's OrderedDict.__reduce__ is (OrderedDict, ([[key, value], ...],)).
    if (a.size() > 1) return nullptr;
    value* d = make(kind::dict);
    d->flag = module == "collections";
    return a.empty() ? d : copy_pairs(d, a[0], module == "collections" ? "OrderedDict" : "dict");
  }
  if (module == "builtins" && (name == "list" || name == "tuple") && a.size() <= 1)
    return a.empty() ? (name == "list" ? make(kind::list) : make_empty_tuple())
                     : copy_items(make(name == "list" ? kind::list : kind::tuple), a[0]);
  if (module == "_codecs" && name == "encode") {
    // How protocols 0-2 spell bytes: _codecs.encode(latin-1 text, 'latin1').
    std::string raw;
    if (a.size() == 2 && a[0]->type == kind::str && a[1]->type == kind::str &&
        is_latin1_name(a[1]->text) && detail::utf8_to_latin1(a[0]->text, &raw)) {
      value* b = make(kind::bytes);
      set_text(b, raw);
      return b;
    }
    return nullptr;
  }
  if (module != "builtins") return nullptr;
  if (name == "set" || name == "frozenset") {
    kind k = name == "set" ? kind::set : kind::frozenset;
    if (a.empty()) return make(k);
    const value* src = a[0];
    if (a.size() != 1 || (src->type != kind::list && src->type != kind::tuple &&
                          src->type != kind::set && src->type != kind::frozenset))
      return nullptr;
    value* s = make(k);
    check_container(src->items.size());
    s->items.reserve(src->items.size());
    for (value* item : src->items) set_add(s, item);
    return s;
  }
  if (name == "bytes" || name == "bytearray") {
    kind k = name == "bytes" ? kind::bytes : kind::bytearray;
    std::string raw;
    if (a.empty()) {
      // empty
    } else if (a.size() == 1 && a[0]->type == kind::bytes) {
      raw = a[0]->text;
    } else if (k == kind::bytearray && a.size() == 2 && a[0]->type == kind::str &&
               a[1]->type == kind::str && is_latin1_name(a[1]->text) &&
               detail::utf8_to_latin1(a[0]->text, &raw)) {
      // bytearray.__reduce_ex__ below protocol 3: (bytearray, (latin-1 text, 'latin-1'))
    } else {
      return nullptr;
    }
    value* b = make(k);
    set_text(b, raw);
    return b;
  }
  return nullptr;
}

// A container built by a call is the container: `src` (a dict, or a list or tuple of
// (key, value) pairs) is copied now, as CPython's constructor iterates it now. Returns
// nullptr, leaving the call a record, when `src` is something only code could iterate.
value* machine::copy_pairs(value* into, const value* src, const char* who) {
  if (src->type == kind::dict) {
    for (size_t i = 0; i < src->dict_size(); ++i) dict_set(into, src->dict_key(i), src->dict_value(i));
    return into;
  }
  if (src->type != kind::list && src->type != kind::tuple) return nullptr;
  for (size_t i = 0; i < src->items.size(); ++i) {
    const value* pair = src->items[i];
    if ((pair->type != kind::list && pair->type != kind::tuple) || pair->items.size() != 2)
      unsupported(std::string(who) + " from a sequence whose element " + std::to_string(i) +
                  " is not a (key, value) pair");
    dict_set(into, pair->items[0], pair->items[1]);
  }
  return into;
}

value* machine::copy_items(value* into, const value* src) {
  if (src->type != kind::list && src->type != kind::tuple) return nullptr;
  check_container(src->items.size());
  charge(src->items.size());
  for (value* item : src->items) link(into, item);
  into->items.assign(src->items.begin(), src->items.end());
  return into;
}

// What pickle writes below protocol 2 for objects: copyreg._reconstructor(cls, base, state)
// (copyreg._reduce_ex), and copyreg.__newobj__(cls, *args) as a REDUCE. Both become what
// protocol 2 writes for the same object (NEWOBJ, then SETITEMS / APPENDS for a dict or
// list subclass), so every reader sees one form. Anything else stays a record.
value* machine::copyreg_call(const value* callable, value* args) {
  if (callable->type != kind::global) return nullptr;
  const item_list& a = args->items;
  if (callable->is_global("copyreg", "__newobj__") && !a.empty()) {
    value* rest = make_empty_tuple();
    if (a.size() > 1) {
      rest = make(kind::tuple);
      copy_items(rest, args);
      rest->items.erase(rest->items.begin(), rest->items.begin() + 1);
    }
    return call(object_op::newobj, a[0], rest);
  }
  if (!callable->is_global("copyreg", "_reconstructor") || a.size() != 3 || a[1]->type != kind::global ||
      a[1]->global_module() != "builtins")
    return nullptr;
  std::string_view base = a[1]->global_attr();
  const value* state = a[2];
  if (base == "object" && state->type == kind::none) return call(object_op::newobj, a[0], make_empty_tuple());
  if (!(base == "dict" && state->type == kind::dict) && !(base == "list" && state->type == kind::list)) return nullptr;
  value* obj = call(object_op::newobj, a[0], make_empty_tuple());
  if (base == "dict" && obj->type == kind::dict) return copy_pairs(obj, state, "dict");
  if (base == "list" && obj->type == kind::list) return copy_items(obj, state);
  if (obj->type != kind::object) return nullptr;
  value* slot = object_slot(obj, base == "dict" ? kDictItems : kListItems, base == "dict" ? kind::dict : kind::list);
  if (base == "dict")
    copy_pairs(slot, state, "dict");
  else
    copy_items(slot, state);
  grow_owner(obj, slot);
  return obj;
}

value* machine::call(object_op how, value* callable, value* args) {
  if (callable->type != kind::global && callable->type != kind::object &&
      callable->type != kind::persistent_id)
    corrupt(std::string("calls a ") + kind_name(callable->type) + ", which is not callable");
  if (how == object_op::newobj || how == object_op::newobj_ex) {
    // cls.__new__(cls) of the data constructors is their empty value. With arguments,
    // __new__ means something else for each (set.__new__ ignores them; bytes.__new__ does
    // not), so those calls stay records.
    if (callable->type == kind::global && args->items.empty()) {
      std::string_view m = callable->global_module(), n = callable->global_attr();
      if (m == "collections" && n == "OrderedDict") {
        value* d = make(kind::dict);
        d->flag = true;
        return d;
      }
      if (m == "builtins" && (n == "dict" || n == "list")) return make(n == "dict" ? kind::dict : kind::list);
      if (m == "builtins" && (n == "set" || n == "frozenset" || n == "bytes" || n == "bytearray"))
        return make(n == "set"         ? kind::set
                    : n == "frozenset" ? kind::frozenset
                    : n == "bytes"     ? kind::bytes
                                       : kind::bytearray);
    }
    return make_object(how, callable, args);
  }
  if (value* v = copyreg_call(callable, args)) return v;
  if (value* folded = fold_data_constructor(callable, args)) return folded;
  return make_object(how, callable, args);
}

// Finds `key` in a large container's index, or records it at `pos`. Returns the position
// of an equal key already present, or -1. A str equals only a str, so str keys are hashed
// by their text and never need a key_table id.
long machine::index_find_or_add(value* container, const value* key, uint32_t pos) {
  if (container != indexed_) {
    indexed_ = container;
    index_ = &indexes_[container];
  }
  size_t stride = container->type == kind::dict ? 2 : 1;
  const item_list& items = container->items;
  if (key->type == kind::str) {
    uint64_t h = mix(std::hash<std::string_view>()(key->text));
    return index_->find_or_add(h, pos, [&](uint32_t at) {
      const value* other = items[stride * at];
      return other->type == kind::str && other->text == key->text;
    });
  }
  uint64_t id = key_id(key);
  return index_->find_or_add(mix(id), pos, [&](uint32_t at) {
    const value* other = items[stride * at];
    return other->type != kind::str && keys_.id(other) == id;
  });
}

void machine::dict_set(value* d, value* key, value* val) {
  size_t n = d->items.size() / 2;
  long found = -1;
  if (n < kIndexThreshold) {
    check_hashable(key);
    for (size_t i = 0; i < n && found < 0; ++i)
      if (keys_.equal(d->items[2 * i], key)) found = long(i);
    if (found < 0 && n + 1 == kIndexThreshold) {
      for (size_t i = 0; i < n; ++i) index_find_or_add(d, d->items[2 * i], uint32_t(i));
      index_find_or_add(d, key, uint32_t(n));
    }
  } else {
    found = index_find_or_add(d, key, uint32_t(n));
  }
  link(d, val);
  if (found >= 0) {
    d->items[2 * size_t(found) + 1] = val;  // Python keeps the first key object and its place
    return;
  }
  check_container(n + 1);
  charge(2);
  link(d, key);
  d->items.push_back(key);
  d->items.push_back(val);
}

void machine::set_add(value* s, value* item) {
  size_t n = s->items.size();
  if (n < kIndexThreshold) {
    check_hashable(item);
    for (size_t i = 0; i < n; ++i)
      if (keys_.equal(s->items[i], item)) return;  // a set keeps the first equal element
    if (n + 1 == kIndexThreshold) {
      for (size_t i = 0; i < n; ++i) index_find_or_add(s, s->items[i], uint32_t(i));
      index_find_or_add(s, item, uint32_t(n));
    }
  } else if (index_find_or_add(s, item, uint32_t(n)) >= 0) {
    return;
  }
  check_container(n + 1);
  charge(1);
  link(s, item);
  s->items.push_back(item);
}

void machine::append(value* target, value* item) {
  value* owner = nullptr;
  if (target->type == kind::object) {
    owner = target;
    target = object_slot(target, kListItems, kind::list);
  }
  if (target->type != kind::list) wrong_target(target);
  check_container(target->items.size() + 1);
  charge(1);
  link(target, item);
  target->items.push_back(item);
  if (owner) grow_owner(owner, target);
}

void machine::extend(value* target, size_t from) {
  value* owner = nullptr;
  if (target->type == kind::object) {
    owner = target;
    target = object_slot(target, kListItems, kind::list);
  }
  if (target->type != kind::list) wrong_target(target);
  check_container(target->items.size() + (stack_.size() - from));
  charge(stack_.size() - from);
  for (size_t i = from; i < stack_.size(); ++i) link(target, stack_[i]);
  target->items.insert(target->items.end(), stack_.begin() + long(from), stack_.end());
  if (owner) grow_owner(owner, target);
}

value* machine::dict_target(value* target, value** owner) {
  *owner = nullptr;
  if (target->type == kind::object) {
    *owner = target;
    target = object_slot(target, kDictItems, kind::dict);
  }
  if (target->type != kind::dict) wrong_target(target);
  return target;
}

// Truth value of a BUILD state as load_build tests it (`if state:` / `if slotstate:`).
bool machine::falsy(const value* v) const {
  switch (v->type) {
    case kind::none:
      return true;
    case kind::boolean:
      return !v->flag;
    case kind::integer:
      return v->integer == 0;
    case kind::floating:
      return v->floating == 0;
    case kind::str:
    case kind::bytes:
    case kind::bytearray:
      return v->text.empty();
    case kind::tuple:
    case kind::list:
    case kind::dict:
    case kind::set:
    case kind::frozenset:
      return v->items.empty();
    default:
      return false;
  }
}

void machine::build(value* inst, value* state) {
  if (inst->type == kind::object || (inst->type == kind::dict && inst->flag)) {
    if (inst->state)
      unsupported("a second BUILD on the same object (its state would be merged by code)");
    link(inst, state);
    inst->state = state;
    return;
  }
  // For a plain value, load_build does nothing when the state is empty, and fails on the
  // missing __dict__ otherwise.
  bool empty = falsy(state) || (state->type == kind::tuple && state->items.size() == 2 &&
                                falsy(state->items[0]) && falsy(state->items[1]));
  if (empty && inst->type != kind::global && inst->type != kind::persistent_id) return;
  wrong_target(inst);
}

// PUT and GET spell the memo key as int(line), which may be any size; keys that do not fit
// in 63 bits cannot have been stored by us.
uint64_t machine::text_memo_key(bool for_put) {
  std::string_view text = line();
  python_int i;
  switch (detail::parse_int_literal(text, false, 4096, &i)) {
    case detail::int_parse::ok:
      break;
    case detail::int_parse::invalid:
      corrupt("invalid memo key " + quoted(text));
    default:
      i.is_small = false;
      i.big = "\x01";  // a huge positive key
  }
  if (i.is_small && i.small >= 0) return uint64_t(i.small);
  bool negative = i.is_small || uint8_t(i.big.back()) >= 0x80;
  if (for_put) {
    if (negative) corrupt("negative PUT argument");
    unsupported("memo key " + quoted(text) + " beyond 2^63");
  }
  corrupt("memo key " + quoted(text) + " was never stored");
}

void machine::load_collection(kind k) {
  size_t from = pop_mark();
  size_t n = stack_.size() - from;
  check_container(n);
  if (k == kind::tuple && n == 0) {
    stack_.resize(from);
    return push(make_empty_tuple());
  }
  value* v = make(k);
  if (k == kind::dict) {
    if (n % 2) corrupt("odd number of items for DICT");
    for (size_t i = from; i < stack_.size(); i += 2) dict_set(v, stack_[i], stack_[i + 1]);
  } else if (k == kind::frozenset) {
    for (size_t i = from; i < stack_.size(); ++i) set_add(v, stack_[i]);
  } else {
    charge(n);
    for (size_t i = from; i < stack_.size(); ++i) link(v, stack_[i]);
    set_items(v, stack_.data() + from, n);
  }
  stack_.resize(from);
  push(v);
}

void machine::load_frame() {
  if (in_frame_)
    corrupt("FRAME inside a frame (" + std::to_string(limit_ - pos_) +
            " bytes of the enclosing frame remain)");
  uint64_t n = load_u64(take(8));
  if (n > size_ - pos_)
    corrupt("frame of " + std::to_string(n) + " bytes runs past the end of the pickle (" +
            std::to_string(size_ - pos_) + " bytes left)");
  if (n > 0) {
    in_frame_ = true;
    limit_ = pos_ + size_t(n);
  }
}

void machine::step() {
  using namespace op;
  switch (code_) {
    // --- protocol and framing
    case PROTO: {
      uint8_t p = take_u8();
      if (p > 5) unsupported("unsupported pickle protocol: " + std::to_string(p));
      proto_ = p;
      doc_.protocol = std::max(doc_.protocol, int(p));
      return;
    }
    case FRAME:
      return load_frame();
    case STOP: {
      doc_.root = pop();
      stopped_ = true;
      return;
    }
    // --- stack manipulation
    case MARK:
      if (marks_.size() >= lim_.max_depth)
        over_limit("pickle MARK nesting deeper than", lim_.max_depth, "--max-depth");
      marks_.push_back(stack_.size());
      return;
    case POP:
      if (stack_.size() > fence()) {
        stack_.pop_back();
      } else if (!marks_.empty()) {
        marks_.pop_back();  // load_pop: an empty frame pops its MARK
      } else {
        underflow();
      }
      return;
    case POP_MARK:
      stack_.resize(pop_mark());
      return;
    case DUP:
      push(top());
      return;
    // --- scalars
    case NONE:
      push(make_none());
      return;
    case NEWTRUE:
    case NEWFALSE:
      push(make_bool(code_ == NEWTRUE));
      return;
    case INT: {
      std::string_view text = line();
      if (text == "00" || text == "01") {  // Python 2's spelling of False / True
        push(make_bool(text == "01"));
        return;
      }
      push(make_int(parse_int(text, true, lim_.max_long_bytes)));
      return;
    }
    case BININT:
      push(make_small(int32_t(load_u32(take(4)))));
      return;
    case BININT1:
      push(make_small(take_u8()));
      return;
    case BININT2:
      push(make_small(load_u16(take(2))));
      return;
    case LONG: {
      std::string_view text = line();
      if (!text.empty() && text.back() == 'L') text.remove_suffix(1);
      push(make_int(parse_int(text, true, lim_.max_long_bytes)));
      return;
    }
    case LONG1:
    case LONG4: {
      int64_t n = code_ == LONG1 ? take_u8() : int32_t(load_u32(take(4)));
      if (n < 0) corrupt("negative byte count");
      if (uint64_t(n) > limit_ - pos_) truncated(uint64_t(n));
      if (uint64_t(n) > lim_.max_long_bytes)
        over_limit("integer longer in bytes than", lim_.max_long_bytes, "--max-long-bytes");
      const uint8_t* p = take(uint64_t(n));
      push(make_long({reinterpret_cast<const char*>(p), size_t(n)}));
      return;
    }
    case FLOAT: {
      std::string_view text = line();
      value* v = make(kind::floating);
      if (!detail::parse_float_literal(text, &v->floating))
        corrupt("invalid float literal " + quoted(text));
      push(v);
      return;
    }
    case BINFLOAT: {
      const uint8_t* p = take(8);
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];  // big-endian
      value* v = make(kind::floating);
      std::memcpy(&v->floating, &bits, 8);
      push(v);
      return;
    }
    // --- strings
    case STRING: {
      std::string_view text = line();
      if (text.size() > lim_.max_string)
        over_limit("string operand longer than", lim_.max_string, "--max-string");
      if (text.size() < 2 || text.front() != text.back() ||
          (text.front() != '\'' && text.front() != '"'))
        corrupt("the STRING opcode argument must be quoted");
      std::string raw;
      if (const char* err = detail::escape_decode(text.substr(1, text.size() - 2), &raw))
        corrupt(err);
      push(make_py2_string(raw));
      return;
    }
    case BINSTRING: {
      int32_t n = int32_t(load_u32(take(4)));
      if (n < 0) corrupt("negative byte count");
      push(make_py2_string(take_string(uint64_t(n))));
      return;
    }
    case SHORT_BINSTRING: {
      uint8_t n = take_u8();
      push(make_py2_string(take_string(n)));
      return;
    }
    case UNICODE: {
      std::string_view text = line();
      if (text.size() > lim_.max_string)
        over_limit("string operand longer than", lim_.max_string, "--max-string");
      std::string decoded;
      if (const char* err = detail::raw_unicode_escape_decode(text, &decoded)) corrupt(err);
      push(make_str(decoded));
      return;
    }
    case BINUNICODE:
    case SHORT_BINUNICODE:
    case BINUNICODE8: {
      uint64_t n = code_ == SHORT_BINUNICODE ? take_u8()
                   : code_ == BINUNICODE     ? load_u32(take(4))
                                             : load_u64(take(8));
      std::string_view s = take_string(n);
      if (!detail::valid_utf8(s, true)) corrupt("invalid UTF-8");
      push(make_str(s));
      return;
    }
    case BINBYTES:
    case SHORT_BINBYTES:
    case BINBYTES8:
    case BYTEARRAY8: {
      uint64_t n = code_ == SHORT_BINBYTES ? take_u8()
                   : code_ == BINBYTES     ? load_u32(take(4))
                                           : load_u64(take(8));
      value* v = make(code_ == BYTEARRAY8 ? kind::bytearray : kind::bytes);
      set_text(v, take_string(n));
      push(v);
      return;
    }
    // --- containers
    case EMPTY_TUPLE:
      push(make_empty_tuple());
      return;
    case EMPTY_LIST:
      push(make(kind::list));
      return;
    case EMPTY_DICT:
      push(make(kind::dict));
      return;
    case EMPTY_SET:
      push(make(kind::set));
      return;
    case TUPLE:
      return load_collection(kind::tuple);
    case LIST:
      return load_collection(kind::list);
    case DICT:
      return load_collection(kind::dict);
    case FROZENSET:
      return load_collection(kind::frozenset);
    case TUPLE1:
    case TUPLE2:
    case TUPLE3: {
      size_t n = size_t(code_ - TUPLE1 + 1);
      need(n);
      value* t = make(kind::tuple);
      charge(n);
      set_items(t, stack_.data() + (stack_.size() - n), n);
      for (value* item : t->items) link(t, item);
      stack_.resize(stack_.size() - n);
      push(t);
      return;
    }
    case APPEND: {
      value* item = pop();
      append(top(), item);
      return;
    }
    case APPENDS: {
      size_t from = pop_mark();
      extend(target_below(from), from);
      stack_.resize(from);
      return;
    }
    case SETITEM: {
      value* val = pop();
      value* key = pop();
      value* owner;
      value* d = dict_target(top(), &owner);
      dict_set(d, key, val);
      if (owner) grow_owner(owner, d);
      return;
    }
    case SETITEMS: {
      size_t from = pop_mark();
      value* target = target_below(from);
      if ((stack_.size() - from) % 2) corrupt("odd number of items for SETITEMS");
      value* owner;
      value* d = dict_target(target, &owner);
      // A dataclass's state dict is filled by one SETITEMS: room for all its pairs at once
      // instead of a block of 4 then a copy into 8 (bounded: a batch of a big dict grows
      // as usual). Room that repeated keys leave unused counts against max_values, as the
      // elements would have.
      size_t room = 0;
      if (d->items.empty()) {
        room = std::min<size_t>(stack_.size() - from, 4096);
        d->items.reserve(room);
      }
      for (size_t i = from; i < stack_.size(); i += 2) dict_set(d, stack_[i], stack_[i + 1]);
      if (room > d->items.size()) charge(room - d->items.size());
      if (owner) grow_owner(owner, d);
      stack_.resize(from);
      return;
    }
    case ADDITEMS: {
      size_t from = pop_mark();
      value* target = target_below(from);
      if (target->type == kind::object)
        unsupported("ADDITEMS on an object would call its add() method");
      if (target->type != kind::set) wrong_target(target);
      for (size_t i = from; i < stack_.size(); ++i) set_add(target, stack_[i]);
      stack_.resize(from);
      return;
    }
    // --- memo
    case PUT:
      return memo_put(text_memo_key(true));
    case BINPUT:
      return memo_put(take_u8());
    case LONG_BINPUT:
      return memo_put(load_u32(take(4)));
    case MEMOIZE:
      return memo_put(memo_.size());
    case GET:
      return memo_get(text_memo_key(false));
    case BINGET:
      return memo_get(take_u8());
    case LONG_BINGET:
      return memo_get(load_u32(take(4)));
    // --- globals and calls
    case GLOBAL:
    case INST: {
      std::string_view module = line();
      std::string_view name = line();
      // GLOBAL decodes its names as UTF-8, INST as ASCII (pickle.py load_global/load_inst).
      bool ok = code_ == GLOBAL
                    ? detail::valid_utf8(module, false) && detail::valid_utf8(name, false)
                    : ascii_only(module) && ascii_only(name);
      if (!ok)
        corrupt("module or attribute name is not valid " +
                std::string(code_ == GLOBAL ? "UTF-8" : "ASCII"));
      if (module.empty() || name.empty()) corrupt("empty module or attribute name");
      value* g = make_global(std::string(module), std::string(name));
      if (code_ == GLOBAL) return push(g);
      size_t from = pop_mark();
      value* args = make(kind::tuple);
      charge(stack_.size() - from);
      set_items(args, stack_.data() + from, stack_.size() - from);
      for (value* item : args->items) link(args, item);
      stack_.resize(from);
      push(call(object_op::inst, g, args));
      return;
    }
    case STACK_GLOBAL: {
      value* name = pop();
      value* module = pop();
      if (name->type != kind::str || module->type != kind::str)
        corrupt("STACK_GLOBAL requires str operands, got " + std::string(kind_name(module->type)) +
                " and " + kind_name(name->type));
      if (module->text.empty() || name->text.empty()) corrupt("empty module or attribute name");
      push(make_global(std::string(module->text), std::string(name->text)));
      return;
    }
    case OBJ: {
      size_t from = pop_mark();
      if (stack_.size() == from) corrupt("no class after the MARK");
      value* cls = stack_[from];
      value* args = make(kind::tuple);
      charge(stack_.size() - from - 1);
      set_items(args, stack_.data() + from + 1, stack_.size() - from - 1);
      for (value* item : args->items) link(args, item);
      stack_.resize(from);
      push(call(object_op::obj, cls, args));
      return;
    }
    case REDUCE: {
      value* args = pop();
      value* callable = top();
      if (args->type != kind::tuple)
        corrupt(std::string("argument is a ") + kind_name(args->type) + ", not a tuple");
      stack_.back() = call(object_op::reduce, callable, args);
      return;
    }
    case NEWOBJ: {
      value* args = pop();
      value* cls = pop();
      if (args->type != kind::tuple)
        corrupt(std::string("argument is a ") + kind_name(args->type) + ", not a tuple");
      push(call(object_op::newobj, cls, args));
      return;
    }
    case NEWOBJ_EX: {
      value* kwargs = pop();
      value* args = pop();
      value* cls = pop();
      if (args->type != kind::tuple || kwargs->type != kind::dict)
        corrupt("expects a tuple and a dict, got " + std::string(kind_name(args->type)) + " and " +
                kind_name(kwargs->type));
      value* v = call(object_op::newobj_ex, cls, args);
      if (v->type != kind::object && !kwargs->items.empty())
        v = make_object(object_op::newobj_ex, cls, args);
      if (v->type == kind::object) {
        if (v->items.size() <= kKwargs) v->items.resize(kKwargs + 1, nullptr);
        v->items[kKwargs] = kwargs;
        link(v, kwargs);
      }
      push(v);
      return;
    }
    case BUILD: {
      value* state = pop();
      build(top(), state);
      return;
    }
    case PERSID: {
      std::string_view pid = line();
      if (!ascii_only(pid)) corrupt("persistent IDs in protocol 0 must be ASCII strings");
      value* v = make(kind::persistent_id);
      charge(1);
      set_items(v, {make_str(pid)});
      push(v);
      return;
    }
    case BINPERSID: {
      value* pid = pop();
      value* v = make(kind::persistent_id);
      charge(1);
      set_items(v, {pid});
      link(v, pid);
      push(v);
      return;
    }
    // --- refused
    case EXT1:
    case EXT2:
    case EXT4:
      unsupported("the copyreg extension registry is not supported");
    case NEXT_BUFFER:
    case READONLY_BUFFER:
      unsupported("out-of-band buffers are not supported");
    default:
      throw_corrupt("invalid opcode 0x" + text::hex_bytes(&code_, 1), where());
  }
}

// The full depth pass, for graphs where link() could not keep heights exact (a container
// gained a deeper child after being nested, or a cycle). Iterative, so it cannot overflow
// the C++ stack; back edges of cycles are skipped; shared sub-graphs are measured once.
// Marks live in the containers' `integer`: 0 unvisited, kOpen on the current path, else
// the height.
void machine::check_depth(const value* root) {
  clear_scratch();
  if (!is_container(root->type)) return;
  constexpr int64_t kOpen = -1;
  struct frame {
    value* node;
    size_t next;
    int64_t deepest;
  };
  std::vector<frame> path;
  auto enter = [&](value* v) {
    if (path.size() >= lim_.max_depth) too_deep(v->offset);
    v->integer = kOpen;
    path.push_back({v, 0, 0});
  };
  enter(const_cast<value*>(root));
  while (!path.empty()) {
    frame& f = path.back();
    value* child = nullptr;
    if (f.next < f.node->items.size()) {
      child = f.node->items[f.next++];
    } else if (f.next == f.node->items.size()) {
      child = f.node->state;
      ++f.next;
    } else {
      int64_t h = f.deepest + 1;
      // A shared sub-graph first measured from a shallow place can still make this path
      // too deep.
      if (uint64_t(h) > lim_.max_depth) too_deep(f.node->offset);
      f.node->integer = h;
      path.pop_back();
      if (!path.empty()) path.back().deepest = std::max(path.back().deepest, h);
      continue;
    }
    if (!child || !is_container(child->type)) continue;
    if (child->integer == 0) {
      enter(child);
    } else if (child->integer != kOpen) {
      f.deepest = std::max(f.deepest, child->integer);
    }
  }
}

document machine::run() {
  if (size_ > lim_.max_pickle_bytes)
    throw_limit("pickle of " + std::to_string(size_) + " bytes is larger than " +
                    std::to_string(lim_.max_pickle_bytes) + " (raise with --max-pickle-bytes)",
                options_.base_offset);
  stack_.reserve(256);
  while (!stopped_) {
    if (in_frame_ && pos_ == limit_) {
      in_frame_ = false;
      limit_ = size_;
    }
    op_pos_ = pos_;
    if (pos_ >= limit_) throw_corrupt("pickle ends without a STOP opcode", where());
    code_ = data_[pos_++];
    step();
  }
  doc_.end_offset = pos_;
  if (options_.require_eof && pos_ != size_)
    throw_corrupt(std::to_string(size_ - pos_) + " bytes after the STOP opcode",
                  options_.base_offset + pos_);
  if (late_) check_depth(doc_.root);
  clear_scratch();
  return std::move(doc_);
}

}  // namespace

document parse(const uint8_t* data, size_t size, const parse_options& options) {
  return machine(data, size, options).run();
}

}  // namespace ckpt::pickle
