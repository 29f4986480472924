// The chunk checks of a DCP checkpoint (docs/formats.md §9.4). PyTorch validates the
// boxes only when it saves (default_planner.py _validate_global_plan); a reader that
// assembles tensors from them must check again, or a lost rank's file reads as zeros.
#include <algorithm>
#include <charconv>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/error.h"

namespace ckpt::dcp {
namespace {

using u128 = unsigned __int128;

std::string box(const chunk& c) {
  return "offsets " + format_shape(c.offsets) + ", sizes " + format_shape(c.sizes);
}

// The metadata file of a box, when several were merged (rank-local metadata, §9.8); the
// caller names the one .metadata otherwise.
std::string source_of(const chunk* c, const std::vector<std::string>& sources) {
  return c && c->source < sources.size() ? sources[c->source] : std::string();
}

[[noreturn]] void corrupt(const std::string& fqn, const std::string& what, std::optional<uint64_t> at,
                          const std::string& file = {}) {
  error e(errc::corrupt, "tensor '" + fqn + "': " + what, at);
  if (!file.empty()) e.with_file(file);
  throw e;
}

u128 volume(const dim_list& sizes) {
  u128 v = 1;
  for (int64_t s : sizes) {
    if (s == 0) return 0;
    v *= u128(s);
    // Past 2^64 no real tensor; stop before 128 bits can overflow.
    if (v > u128(UINT64_MAX)) return u128(UINT64_MAX) + 1;
  }
  return v;
}

// std::stable_sort's order without its temporary buffer (a heap block per call) for the
// few boxes a tensor usually has: insertion sort is stable.
template <class Less>
void stable_sort_small(std::vector<const chunk*>& v, Less less) {
  if (v.size() > 32) return std::stable_sort(v.begin(), v.end(), less);
  for (size_t i = 1; i < v.size(); ++i) {
    const chunk* x = v[i];
    size_t j = i;
    for (; j > 0 && less(x, v[j - 1]); --j) v[j] = v[j - 1];
    v[j] = x;
  }
}

bool empty_box(const chunk& c) {
  return std::any_of(c.sizes.begin(), c.sizes.end(), [](int64_t s) { return s == 0; });
}

bool overlaps(const chunk& a, const chunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  return true;
}

// A box of elements no chunk holds, found on the grid the chunk boundaries draw; nullopt
// when that grid is too large to walk (the error then gives counts only).
std::optional<chunk> find_gap(const tensor_meta& t, const std::vector<const chunk*>& boxes) {
  size_t rank = t.size.size();
  std::vector<std::vector<int64_t>> cuts(rank);
  u128 cells = 1;
  for (size_t d = 0; d < rank; ++d) {
    cuts[d] = {0, t.size[d]};
    for (const chunk* c : boxes) {
      cuts[d].push_back(c->offsets[d]);
      cuts[d].push_back(c->offsets[d] + c->sizes[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    cells *= u128(cuts[d].size() - 1);
    if (cells * u128(boxes.size() + 1) > (u128(1) << 24)) return std::nullopt;
  }
  std::vector<size_t> at(rank, 0);
  while (true) {
    chunk cell;
    for (size_t d = 0; d < rank; ++d) {
      cell.offsets.push_back(cuts[d][at[d]]);
      cell.sizes.push_back(cuts[d][at[d] + 1] - cuts[d][at[d]]);
    }
    if (std::none_of(boxes.begin(), boxes.end(), [&](const chunk* c) { return overlaps(*c, cell); })) return cell;
    size_t d = rank;
    while (d > 0 && ++at[d - 1] + 1 == cuts[d - 1].size()) at[--d] = 0;
    if (d == 0) return std::nullopt;
  }
}

}  // namespace

namespace {

std::string format_ints(const int64_t* v, size_t n) {
  // Once per chunk in every storage key ("w@(0, 0)"): one string, no temporaries.
  std::string s;
  s.reserve(2 + 8 * n);
  s += '(';
  char digits[24];
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    s.append(digits, std::to_chars(digits, digits + sizeof digits, v[i]).ptr);
  }
  s += n == 1 ? ",)" : ")";
  return s;
}

}  // namespace

std::string format_shape(const dim_list& v) { return format_ints(v.data(), v.size()); }

void check_coverage(const std::string& fqn, const tensor_meta& t, const std::vector<std::string>& sources) {
  const size_t rank = t.size.size();
  u128 numel = volume(t.size);
  if (numel > u128(INT64_MAX)) corrupt(fqn, "global shape " + format_shape(t.size) + " is too large", std::nullopt);

  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const chunk& c = t.chunks[i];
    if (c.offsets.size() != rank || c.sizes.size() != rank)
      corrupt(fqn, "chunk " + std::to_string(i) + " (" + box(c) + ") has the wrong rank for global shape " +
                       format_shape(t.size), c.at, source_of(&c, sources));
    for (size_t d = 0; d < rank; ++d)
      if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > t.size[d] || c.sizes[d] > t.size[d] - c.offsets[d])
        corrupt(fqn, "chunk " + std::to_string(i) + " (" + box(c) + ") lies outside the global shape " +
                         format_shape(t.size), c.at, source_of(&c, sources));
  }

  // A replicated tensor listed once per replica is one box; distinct non-empty boxes must
  // be disjoint. Sweep along the dimension with the most distinct starts, so row- and
  // column-sharded tensors alike compare each box with its neighbours only.
  // Per-thread scratch: 20,000 sharded keys made 140,000 small vectors and sort buffers.
  thread_local std::vector<const chunk*> boxes, by_start;
  thread_local std::vector<int64_t> starts;
  boxes.clear();
  for (const chunk& c : t.chunks)
    if (!empty_box(c)) boxes.push_back(&c);
  auto same = [](const chunk* a, const chunk* b) { return a->offsets == b->offsets && a->sizes == b->sizes; };
  auto order = [](const chunk* a, const chunk* b) {
    return std::tie(a->offsets, a->sizes) < std::tie(b->offsets, b->sizes);
  };
  stable_sort_small(boxes, order);
  boxes.erase(std::unique(boxes.begin(), boxes.end(), same), boxes.end());

  size_t sweep = 0, best = 0;
  for (size_t d = 0; d < rank; ++d) {
    starts.clear();
    for (const chunk* c : boxes) starts.push_back(c->offsets[d]);
    std::sort(starts.begin(), starts.end());
    size_t distinct = size_t(std::unique(starts.begin(), starts.end()) - starts.begin());
    if (distinct > best) best = distinct, sweep = d;
  }
  by_start.assign(boxes.begin(), boxes.end());
  if (rank > 0)
    stable_sort_small(by_start, [&](const chunk* a, const chunk* b) { return a->offsets[sweep] < b->offsets[sweep]; });
  for (size_t i = 0; i < by_start.size(); ++i) {
    const chunk& a = *by_start[i];
    for (size_t j = i + 1; j < by_start.size(); ++j) {
      const chunk& b = *by_start[j];
      if (rank > 0 && b.offsets[sweep] >= a.offsets[sweep] + a.sizes[sweep]) break;
      if (overlaps(a, b)) {
        // Boxes of one file in file order; of two rank files, the later rank's is named.
        const bool a_later = std::tie(a.source, a.at) > std::tie(b.source, b.at);
        const chunk& later = a_later ? a : b;
        const chunk& earlier = a_later ? b : a;
        std::string other = earlier.source != later.source ? " of " + source_of(&earlier, sources) : "";
        corrupt(fqn, "chunk (" + box(later) + ") overlaps chunk (" + box(earlier) + ")" + other, later.at,
                source_of(&later, sources));
      }
    }
  }

  u128 covered = 0;
  for (const chunk* c : boxes) covered += volume(c->sizes);
  if (covered != numel) {
    std::string whole = "of global shape " + format_shape(t.size);
    std::optional<uint64_t> at;
    if (!t.chunks.empty()) at = t.chunks.front().at;
    // Merged rank files: the gap is no one file's fault; the first file is named, and the
    // message says how many ranks' boxes were seen.
    const std::string file = source_of(t.chunks.empty() ? nullptr : &t.chunks.front(), sources);
    if (!sources.empty()) whole += " (boxes of " + std::to_string(sources.size()) + " rank-local metadata files)";
    if (std::optional<chunk> gap = find_gap(t, boxes))
      corrupt(fqn, "no chunk holds the elements at " + box(*gap) + " " + whole, at, file);
    corrupt(fqn, "the chunks hold " + std::to_string(uint64_t(covered)) + " of the " + std::to_string(uint64_t(numel)) +
                     " elements " + whole, at, file);
  }
}

storage_index check_storage_index(const metadata& md) {
  // MetadataIndex equality is (fqn, offset); index is only a hint (metadata.py:163).
  auto fail = [&](const std::string& what, std::optional<uint64_t> at, uint32_t source) {
    error e(errc::corrupt, what, at);
    if (source < md.sources.size() && !md.sources[source].empty()) e.with_file(md.sources[source]);
    throw e;
  };
  storage_index where(md.storage_data, md.sources);
  // Each chunk and BYTE_IO item finds its entry; an entry no one found belongs to nothing.
  std::vector<bool> used(md.storage_data.size(), false);
  for (const item& it : md.items) {
    if (!it.is_tensor) {
      const storage_item* s = where.find(it.fqn, nullptr);
      if (!s) fail("item '" + it.fqn + "': storage_data has no entry for its bytes", std::nullopt, 0);
      used[size_t(s - md.storage_data.data())] = true;
      continue;
    }
    for (const chunk& c : it.tensor.chunks) {
      const storage_item* s = where.find(it.fqn, &c.offsets);
      if (!s)
        fail("tensor '" + it.fqn + "': storage_data has no entry for its chunk at offsets " + format_shape(c.offsets),
             std::nullopt, c.source);
      used[size_t(s - md.storage_data.data())] = true;
    }
  }
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) {
      const storage_item& s = md.storage_data[i];
      fail("storage_data entry for '" + s.fqn + "'" + (s.offsets ? " at offsets " + format_shape(*s.offsets) : "") +
               " matches no chunk or item of state_dict_metadata",
           s.at, s.source);
    }
  return where;
}

storage_index check_metadata(const metadata& md) {
  for (const item& it : md.items)
    if (it.is_tensor) check_coverage(it.fqn, it.tensor, md.sources);
  return check_storage_index(md);
}

}  // namespace ckpt::dcp
