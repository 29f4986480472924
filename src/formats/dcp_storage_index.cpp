// storage_data as a hash table keyed as MetadataIndex compares, (fqn, offset) (docs/formats.md
// §9.2): a DCP directory of 20,000 sharded keys has 80,000 entries, each looked up once by
// check_metadata (§9.4) and once by the reader. Keys stay in the entries themselves; the table
// holds only their positions.
#include <limits>
#include <string>

#include "ckpt/dcp.h"
#include "ckpt/error.h"

namespace ckpt::dcp {
namespace {

const dim_list* offsets_of(const storage_item& s) { return s.offsets ? &*s.offsets : nullptr; }

uint64_t hash_of(std::string_view fqn, const dim_list* offsets) {
  uint64_t h = std::hash<std::string_view>{}(fqn);
  if (offsets) {
    for (int64_t x : *offsets) h = (h ^ uint64_t(x)) * 0x9E3779B97F4A7C15ull;
    h ^= 1;  // a chunk at () and a BYTE_IO item of the same name differ
  }
  // murmur3's finalizer: the slot (low bits) and the tag (high bits) both depend on every bit.
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 33);
}

// A slot holds the entry's index + 1 (0: empty) and its hash's high half, which rules out
// almost every other entry on the probe path without touching it.
uint64_t slot_of(uint64_t hash, size_t entry) { return (hash & 0xFFFFFFFF00000000ull) | uint64_t(entry + 1); }
size_t entry_of(uint64_t slot) { return size_t(uint32_t(slot)) - 1; }
bool tag_matches(uint64_t slot, uint64_t hash) { return (slot ^ hash) >> 32 == 0; }

bool same(const storage_item& s, std::string_view fqn, const dim_list* offsets) {
  const dim_list* mine = offsets_of(s);
  return s.fqn == fqn && (mine && offsets ? *mine == *offsets : mine == offsets);
}

}  // namespace

storage_index::storage_index(const std::vector<storage_item>& entries, const std::vector<std::string>& sources)
    : entries_(&entries) {
  if (entries.size() >= std::numeric_limits<uint32_t>::max() / 4)
    throw_limit("storage_data has " + std::to_string(entries.size()) + " entries, more than this reader indexes");
  size_t n = 16;
  while (n < 2 * entries.size()) n *= 2;  // at most half full: short probe runs
  slots_.assign(n, 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    const storage_item& s = entries[i];
    const uint64_t h = hash_of(s.fqn, offsets_of(s));
    size_t at = h & (n - 1);
    for (; slots_[at] != 0; at = (at + 1) & (n - 1))
      if (tag_matches(slots_[at], h) && same(entries[entry_of(slots_[at])], s.fqn, offsets_of(s)))
      {
        error e(errc::corrupt, "storage_data lists '" + s.fqn + "'" +
                                   (s.offsets ? " at offsets " + format_shape(*s.offsets) : "") + " twice",
                s.at);
        if (s.source < sources.size()) e.with_file(sources[s.source]);
        throw e;
      }
    slots_[at] = slot_of(h, i);
  }
}

const storage_item* storage_index::find(std::string_view fqn, const dim_list* offsets) const {
  if (slots_.empty()) return nullptr;
  const size_t mask = slots_.size() - 1;
  const uint64_t h = hash_of(fqn, offsets);
  for (size_t at = h & mask; slots_[at] != 0; at = (at + 1) & mask) {
    if (!tag_matches(slots_[at], h)) continue;
    const storage_item& s = (*entries_)[entry_of(slots_[at])];
    if (same(s, fqn, offsets)) return &s;
  }
  return nullptr;
}

}  // namespace ckpt::dcp
