#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "ckpt/pickle.h"

static_assert(sizeof(ckpt::pickle::value) == 48, "see limits::max_values before growing a node");

namespace ckpt::pickle {

namespace {

// Arena chunks: big enough that a million keys take a few hundred, small enough that a
// tiny pickle does not reserve much. A request larger than a chunk gets a chunk of its own.
constexpr size_t kArenaChunk = size_t(1) << 20;

}  // namespace

document::document(document&& o) noexcept { *this = std::move(o); }

document& document::operator=(document&& o) noexcept {
  if (this != &o) {
    destroy();
    root = o.root;
    protocol = o.protocol;
    end_offset = o.end_offset;
    blocks_ = std::move(o.blocks_);
    count_ = o.count_;
    chunks_ = std::move(o.chunks_);
    arena_next_ = o.arena_next_;
    arena_left_ = o.arena_left_;
    o.forget();
  }
  return *this;
}

document::~document() { destroy(); }

void document::destroy() {
  // Nodes first: an owned text or a grown element list is freed by its node; borrowed
  // ones go with the arena below.
  for (size_t b = 0; b < blocks_.size(); ++b) {
    size_t made = std::min(kBlockNodes, count_ - b * kBlockNodes);
    for (size_t i = 0; i < made; ++i) blocks_[b][i].~value();
    std::free(blocks_[b]);
  }
  for (char* c : chunks_) std::free(c);
  forget();
}

void document::forget() {
  blocks_.clear();
  count_ = 0;
  chunks_.clear();
  arena_next_ = nullptr;
  arena_left_ = 0;
  root = nullptr;
}

value* document::make(kind type, uint64_t offset) {
  if (count_ == blocks_.size() * kBlockNodes) {
    blocks_.reserve(blocks_.size() + 1);
    void* p = std::malloc(kBlockNodes * sizeof(value));
    if (!p) throw std::bad_alloc();
    blocks_.push_back(static_cast<value*>(p));
  }
  value* v = new (&blocks_[count_ >> kBlockShift][count_ & (kBlockNodes - 1)]) value();
  ++count_;
  v->type = type;
  constexpr uint64_t kMaxOffset = (uint64_t(1) << 40) - 1;  // value::offset has 40 bits
  v->offset = offset < kMaxOffset ? offset : kMaxOffset;
  v->id = count_ <= UINT32_MAX ? uint32_t(count_) : 0;
  return v;
}

void* document::arena_alloc(size_t bytes, size_t align) {
  size_t pad = (align - reinterpret_cast<uintptr_t>(arena_next_) % align) % align;
  if (arena_next_ && pad + bytes <= arena_left_) {
    char* p = arena_next_ + pad;
    arena_next_ = p + bytes;
    arena_left_ -= pad + bytes;
    return p;
  }
  if (bytes > kArenaChunk / 4) {
    // A large piece gets a chunk of its own; the current chunk keeps its free room.
    chunks_.reserve(chunks_.size() + 1);
    char* p = static_cast<char*>(std::malloc(bytes));
    if (!p) throw std::bad_alloc();
    chunks_.push_back(p);
    return p;
  }
  chunks_.reserve(chunks_.size() + 1);
  char* c = static_cast<char*>(std::malloc(kArenaChunk));
  if (!c) throw std::bad_alloc();
  chunks_.push_back(c);
  arena_next_ = c + bytes;
  arena_left_ = kArenaChunk - bytes;
  return c;
}

std::string_view document::keep(std::string_view s) {
  if (s.empty()) return {};
  char* p = static_cast<char*>(arena_alloc(s.size(), 1));
  std::memcpy(p, s.data(), s.size());
  return {p, s.size()};
}

value** document::keep_items(size_t n) {
  if (n == 0) return nullptr;
  if (n > SIZE_MAX / sizeof(value*)) throw std::bad_alloc();
  return static_cast<value**>(arena_alloc(n * sizeof(value*), alignof(value*)));
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
