// The one-pass `.metadata` decoder (docs/formats.md §9.11). The tree decoder builds a node
// for every value of the pickle (2.5 M for 20,000 keys x 4 ranks) and then walks them; this
// one keeps each value in 8 bytes (scalars inline, strings as views into the input,
// containers and objects as small records in a few flat arrays) and reads the entries off
// those records at the end.
//
// It is an accelerator, never a judge: whatever it is not sure of it declines (returns
// false) and decode_metadata asks the tree decoder, whose answer (a result, or an error
// with its byte offset) stands. So it only has to be exact on what it accepts, and it
// accepts one form: what CPython's pickler writes for DCP's dataclasses, protocol 3-5,
// every value made reachable from the root and checked against the schema below. That last
// rule is what lets it skip the tree machine's nesting-depth and hashing bookkeeping: no
// value escapes the schema, whose depth is fixed, so no accepted file can nest deeper than
// kSchemaDepth. The limits it checks are those the tree machine would enforce on the same
// opcodes, counted so that its totals are never below the machine's (it declines first).
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "base/byteio.h"
#include "base/scratch_array.h"
#include "ckpt/file_opener.h"
#include "formats/dcp_metadata_decoders.h"
#include "pickle/pickle_opcodes.h"
#include "pickle/pickle_text.h"

namespace ckpt::dcp::detail {
namespace {

struct decline {};  // thrown inside, caught at the top: "ask the tree decoder"

[[noreturn]] void no() { throw decline{}; }

// Containers the schema nests at most (Metadata > state > storage_data > MetadataIndex >
// state > torch.Size > args > dims, and the like): well under this.
constexpr uint64_t kSchemaDepth = 32;

// A value in 8 bytes: a 4-bit tag and a 60-bit payload.
enum tag : uint64_t {
  t_absent = 0,  // an empty memo slot
  t_none,
  t_true,
  t_false,
  t_int,     // payload: the integer, 60-bit two's complement
  t_str,     // payload: input offset << 24 | length
  t_tuple,   // payload: start in elems_ << 24 | length
  t_list,    // payload: index in seqs_
  t_dict,    // payload: index in seqs_ (pairs: key, value)
  t_object,  // payload: index in objs_
  t_global,  // payload: index in globals_
};
using slot = uint64_t;
constexpr uint64_t kPayload = (uint64_t(1) << 60) - 1;
constexpr uint64_t kLen24 = (uint64_t(1) << 24) - 1;
inline tag tag_of(slot s) { return tag(s >> 60); }
inline uint64_t payload(slot s) { return s & kPayload; }
inline slot make(tag t, uint64_t p) { return (uint64_t(t) << 60) | p; }

// The globals the schema knows; any other declines (the tree decoder then says whether it
// is unsafe, folded, or merely unexpected).
enum class cls : uint8_t {
  metadata, tensor_md, bytes_md, chunk_md, properties, mem_format, index, storage_meta, storage_info,
  get_layout, path, size, dtype,
};

struct global_rec {
  std::string_view module, name;
  cls c;
};
struct object_rec {
  uint64_t offset;  // of the NEWOBJ / REDUCE that made it, as the tree's node offset
  slot args;
  slot state = make(t_absent, 0);
  uint32_t global;
  cls c;
  bool is_key = false;  // already a storage_data key (a second use would be a repeated key)
};
// A list or dict: its elements in segments of elems_ (one per APPENDS / SETITEMS batch
// that could not extend the previous one in place).
struct seq_rec {
  uint32_t head = UINT32_MAX, tail = UINT32_MAX;
  uint64_t count = 0;  // elements (a dict: keys and values)
};
struct segment {
  uint64_t start;
  uint32_t len;
  uint32_t next = UINT32_MAX;
};

// The keys of one big dict, to find a repeated one: open addressing over views into the
// input, no allocation per key (an unordered_set node each was 5% of the decoder).
class key_set {
 public:
  explicit key_set(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, std::string_view());
    used_.assign(cap, false);
  }
  // False when `k` was inserted before.
  bool insert(std::string_view k) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = std::hash<std::string_view>()(k) & mask;; i = (i + 1) & mask) {
      if (!used_[i]) {
        used_[i] = true;
        slots_[i] = k;
        if (++count_ * 2 > slots_.size()) grow();
        return true;
      }
      if (slots_[i] == k) return false;
    }
  }

 private:
  void grow() {
    std::vector<std::string_view> old;
    old.reserve(count_);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (used_[i]) old.push_back(slots_[i]);
    slots_.assign(slots_.size() * 2, std::string_view());
    used_.assign(slots_.size(), false);
    count_ = 0;
    for (std::string_view k : old) insert(k);
  }
  std::vector<std::string_view> slots_;
  std::vector<bool> used_;
  size_t count_ = 0;
};

class stream_decoder {
 public:
  // Every record and element comes from an opcode of at least one byte (an object from
  // three: its class, its arguments, the call), which bounds each array by the input.
  stream_decoder(const uint8_t* data, size_t size, const pickle::limits& lim)
      : data_(data), size_(size), lim_(lim), limit_(size), memo_(2 * size + 4100), elems_(size + 16),
        segs_(size + 16), seqs_(size + 16), objs_(size / 3 + 16) {}

  void run(metadata* out);

 private:
  // --- input, with the tree machine's frame rules (a violation declines) -------------
  const uint8_t* take(uint64_t n) {
    if (n > limit_ - pos_) no();
    const uint8_t* p = data_ + pos_;
    pos_ += size_t(n);
    return p;
  }
  std::string_view line() {
    const uint8_t* start = data_ + pos_;
    const void* nl = std::memchr(start, '\n', limit_ - pos_);
    if (!nl) no();
    size_t n = size_t(static_cast<const uint8_t*>(nl) - start);
    pos_ += n + 1;
    return {reinterpret_cast<const char*>(start), n};
  }
  void frame() {
    if (in_frame_) no();
    uint64_t n = load_u64(take(8));
    if (n > size_ - pos_) no();
    if (n > 0) {
      in_frame_ = true;
      limit_ = pos_ + size_t(n);
    }
  }

  // --- stack and limits ----------------------------------------------------------------
  size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(slot s) {
    if (stack_.size() >= lim_.max_stack) no();
    stack_.push_back(s);
  }
  slot pop() {
    if (stack_.size() <= fence()) no();
    slot s = stack_.back();
    stack_.pop_back();
    return s;
  }
  slot top() const {
    if (stack_.size() <= fence()) no();
    return stack_.back();
  }
  size_t pop_mark() {
    if (marks_.empty()) no();
    size_t k = marks_.back();
    marks_.pop_back();
    return k;
  }
  // At least what the tree machine charges for the same opcodes (limits::max_values).
  void charge(uint64_t n) {
    values_ += n;
    if (values_ > lim_.max_values) no();
  }
  void check_container(uint64_t n) const {
    if (n > std::min<uint64_t>(lim_.max_container, 0xFFFFFFF0u)) no();
  }

  // --- values --------------------------------------------------------------------------
  void push_int(int64_t v) {
    if (v < -(int64_t(1) << 59) || v >= (int64_t(1) << 59)) no();
    charge(1);
    push(make(t_int, uint64_t(v) & kPayload));
  }
  void push_str(uint64_t n) {
    if (n > limit_ - pos_ || n > lim_.max_string || n > kLen24) no();
    const uint64_t at = pos_;
    std::string_view s(reinterpret_cast<const char*>(take(n)), size_t(n));
    if (!pickle::detail::valid_utf8(s, true)) no();
    charge(1);
    push(make(t_str, (at << 24) | n));
  }
  void push_tuple(size_t from) {
    const size_t n = stack_.size() - from;
    check_container(n);
    if (n > kLen24 || elems_.size() >= (uint64_t(1) << 36)) no();
    charge(1 + n);
    const uint64_t start = elems_.size();
    if (n > elems_.capacity() - start) no();
    elems_.append(stack_.data() + from, n);
    stack_.resize(from);
    push(make(t_tuple, (start << 24) | n));
  }
  void push_seq(tag t) {
    charge(1);
    if (seqs_.size() == seqs_.capacity()) no();
    seqs_.push_back(seq_rec{});
    push(make(t, seqs_.size() - 1));
  }
  // Appends stack_[from..] to a list or dict record.
  void extend(slot target, tag want, size_t from) {
    if (tag_of(target) != want) no();
    seq_rec& r = seqs_[payload(target)];
    const size_t n = stack_.size() - from;
    check_container((r.count + n) / (want == t_dict ? 2 : 1));
    charge(n);
    if (n == 0) return;
    if (r.tail != UINT32_MAX && segs_[r.tail].start + segs_[r.tail].len == elems_.size() &&
        uint64_t(segs_[r.tail].len) + n < UINT32_MAX) {
      segs_[r.tail].len += uint32_t(n);
    } else {
      if (segs_.size() >= std::min<size_t>(UINT32_MAX - 1, segs_.capacity()) || n >= UINT32_MAX) no();
      segs_.push_back({elems_.size(), uint32_t(n), UINT32_MAX});
      const uint32_t s = uint32_t(segs_.size() - 1);
      if (r.tail == UINT32_MAX)
        r.head = s;
      else
        segs_[r.tail].next = s;
      r.tail = s;
    }
    if (n > elems_.capacity() - elems_.size()) no();
    elems_.append(stack_.data() + from, n);
    r.count += n;
  }
  void make_global(std::string_view module, std::string_view name) {
    // Below protocol 3 the tree machine renames Python 2 modules: not this decoder's form.
    if (proto_ < 3 || module.empty() || name.empty()) no();
    cls c;
    if (module == "torch.distributed.checkpoint.metadata") {
      if (name == "Metadata") c = cls::metadata;
      else if (name == "TensorStorageMetadata") c = cls::tensor_md;
      else if (name == "BytesStorageMetadata") c = cls::bytes_md;
      else if (name == "ChunkStorageMetadata") c = cls::chunk_md;
      else if (name == "TensorProperties") c = cls::properties;
      else if (name == "_MEM_FORMAT_ENCODING") c = cls::mem_format;
      else if (name == "MetadataIndex") c = cls::index;
      else if (name == "StorageMeta") c = cls::storage_meta;
      else no();
    } else if (module == "torch.distributed.checkpoint.filesystem" && name == "_StorageInfo") {
      c = cls::storage_info;
    } else if (module == "torch.serialization" && name == "_get_layout") {
      c = cls::get_layout;
    } else if ((module == "pathlib" || module == "pathlib._local") &&
               (name == "PosixPath" || name == "WindowsPath" || name == "PurePosixPath" ||
                name == "PureWindowsPath" || name == "Path")) {
      c = cls::path;
    } else if (module == "torch" && name == "Size") {
      c = cls::size;
    } else if (module == "torch" && name.find('.') == std::string_view::npos && dtype_from_name(name)) {
      c = cls::dtype;
    } else {
      no();
    }
    charge(5);
    globals_.push_back({module, name, c});
    push(make(t_global, globals_.size() - 1));
  }
  // REDUCE and NEWOBJ of a known class with a tuple: an object record. (The tree machine
  // folds calls of a few builtins into data; none of them is a known class.)
  slot make_object(slot callable, slot args, uint64_t offset) {
    if (tag_of(args) != t_tuple || tag_of(callable) != t_global) no();
    charge(6);
    if (objs_.size() == objs_.capacity()) no();
    const uint32_t g = uint32_t(payload(callable));
    objs_.push_back({offset, args, make(t_absent, 0), g, globals_[g].c, false});
    return make(t_object, objs_.size() - 1);
  }
  void memo_put(uint64_t key) {
    const slot v = top();
    if (key >= memo_.size()) {
      if (key > 2 * memo_count_ + 4096 || key >= memo_.capacity()) no();  // sparse: the tree machine's business
      memo_.resize(size_t(key) + 1);  // room never written is zero: t_absent
    }
    if (tag_of(memo_[key]) == t_absent) {
      if (memo_count_ >= lim_.max_memo) no();
      ++memo_count_;
    }
    memo_[key] = v;
  }
  void memo_get(uint64_t key) {
    if (key >= memo_.size() || tag_of(memo_[key]) == t_absent) no();
    push(memo_[key]);
  }
  void step(uint8_t code);

  // --- the entries (the schema) --------------------------------------------------------
  std::string_view str(slot s) const {
    if (tag_of(s) != t_str) no();
    const uint64_t p = payload(s);
    return {reinterpret_cast<const char*>(data_ + (p >> 24)), size_t(p & kLen24)};
  }
  const slot* tuple(slot s, size_t* n) const {
    if (tag_of(s) != t_tuple) no();
    *n = size_t(payload(s) & kLen24);
    return elems_.data() + (payload(s) >> 24);
  }
  // Every element of a list, or every (key, value) of a dict, in order.
  template <class F>
  void each(slot s, tag want, F&& f) const {
    if (tag_of(s) != want) no();
    const seq_rec& r = seqs_[payload(s)];
    for (uint32_t g = r.head; g != UINT32_MAX; g = segs_[g].next) {
      const segment& sg = segs_[g];
      if (want == t_dict) {
        if (sg.len % 2) no();  // a pair split across batches: not the pickler's form
        for (uint32_t i = 0; i < sg.len; i += 2) f(elems_[sg.start + i], elems_[sg.start + i + 1]);
      } else {
        for (uint32_t i = 0; i < sg.len; ++i) f(elems_[sg.start + i], slot(0));
      }
    }
  }
  size_t count(slot s) const { return size_t(seqs_[payload(s)].count); }
  const object_rec& object(slot s, cls c) const {
    if (tag_of(s) != t_object) no();
    const object_rec& o = objs_[payload(s)];
    if (o.c != c) no();
    return o;
  }
  // A dataclass instance: NEWOBJ(cls, ()) + BUILD(dict of str keys). Fills `fields` (one
  // per name in `names`, absent when missing); a repeated or unknown field declines.
  template <size_t N>
  const object_rec& dataclass(slot s, cls c, const std::string_view (&names)[N], slot (&fields)[N]) const {
    const object_rec& o = object(s, c);
    size_t n = 0;
    tuple(o.args, &n);
    if (n != 0) no();
    for (slot& f : fields) f = make(t_absent, 0);
    each(o.state, t_dict, [&](slot k, slot v) {
      std::string_view key = str(k);
      size_t i = 0;
      while (i < N && names[i] != key) ++i;
      if (i == N || tag_of(fields[i]) != t_absent) no();
      fields[i] = v;
    });
    return o;
  }
  static bool absent_or_none(slot s) { return tag_of(s) == t_absent || tag_of(s) == t_none; }
  static int64_t int_of(slot s) {
    const uint64_t p = payload(s);
    return int64_t(p << 4) >> 4;
  }
  // The tree walk's integer(): an int, or a bool as 0/1.
  static int64_t integer(slot s) {
    if (tag_of(s) == t_int) return int_of(s);
    if (tag_of(s) == t_true) return 1;
    if (tag_of(s) == t_false) return 0;
    no();
  }
  static bool flag(slot s) {
    if (tag_of(s) == t_true) return true;
    if (tag_of(s) == t_false) return false;
    if (tag_of(s) == t_int && (int_of(s) == 0 || int_of(s) == 1)) return int_of(s) == 1;
    no();
  }
  // A call of a known class with no BUILD: its arguments.
  const slot* call_args(slot s, cls c, size_t* n) const {
    const object_rec& o = object(s, c);
    if (tag_of(o.state) != t_absent) no();
    return tuple(o.args, n);
  }
  dim_list size_of(slot s, bool allow_negative) const {
    size_t n = 0;
    const slot* a = call_args(s, cls::size, &n);
    if (n != 1) no();
    size_t d = 0;
    const slot* dims = tuple(a[0], &d);
    if (d > 64) no();
    dim_list out(d);
    for (size_t i = 0; i < d; ++i) {
      out[i] = integer(dims[i]);
      if (!allow_negative && out[i] < 0) no();
    }
    return out;
  }
  void properties(slot s, tensor_meta& t) const {
    const object_rec& o = object(s, cls::properties);
    size_t n = 0;
    tuple(o.args, &n);
    if (n != 0) no();
    const slot* st = tuple(o.state, &n);
    if (n != 5) no();
    if (tag_of(st[0]) != t_global || globals_[payload(st[0])].c != cls::dtype) no();
    t.type = *dtype_from_name(globals_[payload(st[0])].name);
    if (tag_of(st[1]) != t_none) {
      const slot* a = call_args(st[1], cls::get_layout, &n);
      if (n != 1 || str(a[0]) != "torch.strided") no();
      t.layout = "torch.strided";
    }
    if (tag_of(st[2]) != t_none) t.requires_grad = flag(st[2]);
    if (tag_of(st[4]) != t_none) t.pin_memory = flag(st[4]);
    const slot* a = call_args(st[3], cls::mem_format, &n);
    if (n != 1) no();
    t.memory_format = integer(a[0]);
    if (t.memory_format < 0 || t.memory_format > 2) no();
  }
  item entry(slot key, slot v) const {
    item it;
    it.fqn = std::string(str(key));
    if (tag_of(v) != t_object) no();
    const object_rec& o = objs_[payload(v)];
    it.at = o.offset;
    if (o.c == cls::bytes_md) {
      size_t n = 0;
      tuple(o.args, &n);
      if (n != 0) no();
      // Its state is never read; only an empty one keeps every value inside the schema.
      if (tag_of(o.state) != t_absent && (tag_of(o.state) != t_dict || count(o.state) != 0)) no();
      return it;
    }
    static constexpr std::string_view kFields[] = {"properties", "size", "chunks"};
    slot f[3];
    dataclass(v, cls::tensor_md, kFields, f);
    it.is_tensor = true;
    if (tag_of(f[0]) == t_absent || tag_of(f[1]) == t_absent || tag_of(f[2]) == t_absent) no();
    properties(f[0], it.tensor);
    it.tensor.size = size_of(f[1], false);
    if (tag_of(f[2]) != t_list) no();
    it.tensor.chunks.reserve(count(f[2]));
    each(f[2], t_list, [&](slot c, slot) {
      static constexpr std::string_view kChunk[] = {"offsets", "sizes"};
      slot cf[2];
      const object_rec& co = dataclass(c, cls::chunk_md, kChunk, cf);
      if (tag_of(cf[0]) == t_absent || tag_of(cf[1]) == t_absent) no();
      chunk ch;
      ch.at = co.offset;
      ch.offsets = size_of(cf[0], true);
      ch.sizes = size_of(cf[1], false);
      if (ch.offsets.size() != it.tensor.size.size() || ch.sizes.size() != it.tensor.size.size()) no();
      it.tensor.chunks.push_back(std::move(ch));
    });
    return it;
  }
  storage_item storage(slot key, slot v) {
    static constexpr std::string_view kIndex[] = {"fqn", "offset", "index"};
    static constexpr std::string_view kInfo[] = {"relative_path", "offset", "length", "transform_descriptors"};
    storage_item si;
    slot kf[3];
    const object_rec& ko = dataclass(key, cls::index, kIndex, kf);
    // The same object twice is one key to the tree machine (identity): a repeated key.
    if (ko.is_key) no();
    objs_[payload(key)].is_key = true;
    si.at = ko.offset;
    si.fqn = std::string(str(kf[0]));
    if (!absent_or_none(kf[1])) si.offsets = size_of(kf[1], true);
    if (!absent_or_none(kf[2])) si.index = integer(kf[2]);
    slot f[4];
    dataclass(v, cls::storage_info, kInfo, f);
    si.relative_path = std::string(str(f[0]));
    if (!relative_name_problem(si.relative_path).empty()) no();
    if (tag_of(f[1]) == t_absent || tag_of(f[2]) == t_absent) no();
    const int64_t off = nonnegative(f[1]), len = nonnegative(f[2]);
    si.offset = uint64_t(off);
    si.length = uint64_t(len);
    if (si.offset + si.length < si.offset) no();
    if (!absent_or_none(f[3])) {
      size_t n = 0;
      if (tag_of(f[3]) == t_tuple) {
        const slot* d = tuple(f[3], &n);
        for (size_t i = 0; i < n; ++i) si.transform_descriptors.emplace_back(str(d[i]));
      } else {
        each(f[3], t_list, [&](slot d, slot) { si.transform_descriptors.emplace_back(str(d)); });
      }
    }
    return si;
  }
  static int64_t nonnegative(slot s) {
    const int64_t x = integer(s);
    if (x < 0) no();
    return x;
  }
  void planner(slot s, metadata& md) const {
    if (absent_or_none(s)) return;
    md.has_planner_data = true;
    // Only DefaultSavePlanner's form; an opaque one (a custom planner's) is the tree's.
    if (tag_of(s) != t_dict) no();
    md.planner_data.reserve(count(s) / 2);
    key_set seen(count(s) / 2);
    each(s, t_dict, [&](slot k, slot v) {
      planner_path pp;
      std::string_view fqn = str(k);
      if (!seen.insert(fqn)) no();
      pp.fqn = std::string(fqn);
      size_t n = 0;
      const slot* p = tuple(v, &n);
      pp.path.resize(n);
      for (size_t i = 0; i < n; ++i) {
        if (tag_of(p[i]) == t_int) {
          pp.path[i].is_index = true;
          pp.path[i].index = int_of(p[i]);
        } else {
          pp.path[i].key = std::string(str(p[i]));
        }
      }
      md.planner_data.push_back(std::move(pp));
    });
  }
  std::optional<std::string> optional_str(slot s) const {
    if (absent_or_none(s)) return std::nullopt;
    return std::string(str(s));
  }
  std::optional<storage_meta> writer_meta(slot s) const {
    if (absent_or_none(s)) return std::nullopt;
    static constexpr std::string_view kFields[] = {"checkpoint_id", "save_id", "load_id", "modules"};
    slot f[4];
    dataclass(s, cls::storage_meta, kFields, f);
    storage_meta sm;
    if (tag_of(f[0]) == t_str) {
      sm.checkpoint_id = std::string(str(f[0]));
    } else if (!absent_or_none(f[0])) {
      size_t n = 0;
      const slot* parts = call_args(f[0], cls::path, &n);
      for (size_t i = 0; i < n; ++i) {
        std::string_view part = str(parts[i]);
        if (!sm.checkpoint_id.empty() && sm.checkpoint_id.back() != '/') sm.checkpoint_id += '/';
        sm.checkpoint_id += part;
      }
    }
    sm.save_id = optional_str(f[1]).value_or("");
    sm.load_id = optional_str(f[2]);
    if (!absent_or_none(f[3])) each(f[3], t_list, [&](slot m, slot) { sm.modules.emplace_back(str(m)); });
    return sm;
  }
  void entries(slot root, metadata& md);

  const uint8_t* data_;
  size_t size_;
  const pickle::limits& lim_;
  size_t pos_ = 0;
  size_t limit_;
  bool in_frame_ = false;
  size_t op_pos_ = 0;
  int proto_ = 0;
  int max_proto_ = 0;
  bool stopped_ = false;
  slot root_ = 0;
  uint64_t values_ = 0;

  std::vector<slot> stack_;
  std::vector<size_t> marks_;
  ckpt::detail::scratch_array<slot> memo_;
  uint64_t memo_count_ = 0;
  ckpt::detail::scratch_array<slot> elems_;
  ckpt::detail::scratch_array<segment> segs_;
  ckpt::detail::scratch_array<seq_rec> seqs_;
  ckpt::detail::scratch_array<object_rec> objs_;
  std::vector<global_rec> globals_;
};

void stream_decoder::step(uint8_t code) {
  using namespace pickle::op;
  switch (code) {
    case PROTO: {
      const uint8_t p = *take(1);
      if (p > 5) no();
      proto_ = p;
      max_proto_ = std::max(max_proto_, int(p));
      return;
    }
    case FRAME:
      return frame();
    case STOP:
      root_ = pop();
      stopped_ = true;
      return;
    case MARK:
      if (marks_.size() >= lim_.max_depth) no();
      marks_.push_back(stack_.size());
      return;
    case NONE:
      charge(1);
      return push(make(t_none, 0));
    case NEWTRUE:
    case NEWFALSE:
      charge(1);
      return push(make(code == NEWTRUE ? t_true : t_false, 0));
    case BININT:
      return push_int(int32_t(load_u32(take(4))));
    case BININT1:
      return push_int(*take(1));
    case BININT2:
      return push_int(load_u16(take(2)));
    case LONG1: {
      const uint8_t n = *take(1);
      if (n > limit_ - pos_ || n > lim_.max_long_bytes) no();
      int64_t v = 0;
      if (!pickle::detail::twos_to_int64({reinterpret_cast<const char*>(take(n)), n}, &v)) no();
      return push_int(v);
    }
    case SHORT_BINUNICODE:
      return push_str(*take(1));
    case BINUNICODE:
      return push_str(load_u32(take(4)));
    case BINUNICODE8:
      return push_str(load_u64(take(8)));
    case EMPTY_TUPLE:
      return push_tuple(stack_.size());
    case TUPLE1:
    case TUPLE2:
    case TUPLE3: {
      const size_t n = size_t(code - TUPLE1 + 1);
      if (stack_.size() - fence() < n) no();
      return push_tuple(stack_.size() - n);
    }
    case TUPLE:
      return push_tuple(pop_mark());
    case EMPTY_LIST:
      return push_seq(t_list);
    case EMPTY_DICT:
      return push_seq(t_dict);
    case APPEND: {
      if (stack_.size() - fence() < 2) no();
      extend(stack_[stack_.size() - 2], t_list, stack_.size() - 1);
      stack_.pop_back();
      return;
    }
    case APPENDS: {
      const size_t from = pop_mark();
      if (from <= fence()) no();
      extend(stack_[from - 1], t_list, from);
      stack_.resize(from);
      return;
    }
    case SETITEM: {
      if (stack_.size() - fence() < 3) no();
      extend(stack_[stack_.size() - 3], t_dict, stack_.size() - 2);
      stack_.resize(stack_.size() - 2);
      return;
    }
    case SETITEMS: {
      const size_t from = pop_mark();
      if (from <= fence() || (stack_.size() - from) % 2) no();
      extend(stack_[from - 1], t_dict, from);
      stack_.resize(from);
      return;
    }
    case BINPUT:
      return memo_put(*take(1));
    case LONG_BINPUT:
      return memo_put(load_u32(take(4)));
    case MEMOIZE:
      return memo_put(memo_count_);
    case BINGET:
      return memo_get(*take(1));
    case LONG_BINGET:
      return memo_get(load_u32(take(4)));
    case GLOBAL: {
      std::string_view module = line();
      std::string_view name = line();
      if (!pickle::detail::valid_utf8(module, false) || !pickle::detail::valid_utf8(name, false)) no();
      return make_global(module, name);
    }
    case STACK_GLOBAL: {
      const slot name = pop();
      const slot module = pop();
      return make_global(str(module), str(name));
    }
    case REDUCE: {
      const slot args = pop();
      stack_.back() = make_object(top(), args, op_pos_);
      return;
    }
    case NEWOBJ: {
      const slot args = pop();
      const slot c = pop();
      return push(make_object(c, args, op_pos_));
    }
    case BUILD: {
      const slot state = pop();
      const slot inst = top();
      if (tag_of(inst) != t_object) no();
      object_rec& o = objs_[payload(inst)];
      if (tag_of(o.state) != t_absent) no();
      o.state = state;
      return;
    }
    default:
      no();  // every other opcode: not what the pickler writes for DCP's dataclasses
  }
}

void stream_decoder::entries(slot root, metadata& md) {
  static constexpr std::string_view kFields[] = {"state_dict_metadata", "planner_data", "storage_data",
                                                 "storage_meta", "version"};
  slot f[5];
  dataclass(root, cls::metadata, kFields, f);
  if (tag_of(f[0]) == t_absent || tag_of(f[2]) == t_absent) no();

  if (tag_of(f[0]) != t_dict) no();
  md.items.reserve(count(f[0]) / 2);
  key_set fqns(count(f[0]) / 2);
  each(f[0], t_dict, [&](slot k, slot v) {
    if (!fqns.insert(str(k))) no();  // a repeated key: the tree keeps one, at its first place
    md.items.push_back(entry(k, v));
  });
  if (tag_of(f[2]) != t_dict) no();
  md.storage_data.reserve(count(f[2]) / 2);
  each(f[2], t_dict, [&](slot k, slot v) { md.storage_data.push_back(storage(k, v)); });
  planner(f[1], md);
  md.writer_meta = writer_meta(f[3]);
  md.version = optional_str(f[4]);
}

void stream_decoder::run(metadata* out) {
  if (size_ > lim_.max_pickle_bytes || size_ >= (uint64_t(1) << 36) || lim_.max_depth < kSchemaDepth) no();
  if (!memo_.ok() || !elems_.ok() || !segs_.ok() || !seqs_.ok() || !objs_.ok()) no();
  stack_.reserve(256);
  while (!stopped_) {
    if (in_frame_ && pos_ == limit_) {
      in_frame_ = false;
      limit_ = size_;
    }
    op_pos_ = pos_;
    if (pos_ >= limit_) no();
    step(data_[pos_++]);
  }
  // Leftovers below the root would be values outside the schema.
  if (pos_ != size_ || !stack_.empty() || !marks_.empty()) no();
  metadata md;
  md.protocol = max_proto_;
  entries(root_, md);
  std::vector<std::string> names;
  names.reserve(globals_.size());
  for (const global_rec& g : globals_) {
    std::string n;
    n.reserve(g.module.size() + 1 + g.name.size());
    n.append(g.module).append(1, '.').append(g.name);
    names.push_back(std::move(n));
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  md.globals = std::move(names);
  *out = std::move(md);
}

}  // namespace

bool decode_metadata_stream(const uint8_t* data, size_t size, const decode_options& options, metadata* out) {
  try {
    stream_decoder(data, size, options.lim).run(out);
    return true;
  } catch (const decline&) {
    return false;
  }
}

}  // namespace ckpt::dcp::detail
