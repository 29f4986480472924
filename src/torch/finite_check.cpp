#include "torch/finite_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

namespace ckpt::detail {
namespace {

constexpr int64_t kChunk = int64_t(1) << 24;  // elements per isfinite call: 16 Mi bools

// float8 types have no isfinite kernel; float32 holds every value they can.
at::Tensor probe(const at::Tensor& t) { return t.element_size() < 2 ? t.to(at::kFloat) : t; }

bool all_finite(const at::Tensor& t) { return t.numel() == 0 || at::isfinite(probe(t)).all().item<bool>(); }

// The storage's elements as one flat tensor of `t`'s dtype.
at::Tensor whole_storage(const at::Tensor& t) {
  const int64_t n = int64_t(t.storage().nbytes() / t.element_size());
  return at::empty({0}, t.options()).set_(t.storage(), 0, {n}, {1});
}

bool flat_finite(const at::Tensor& flat) {
  const int64_t n = flat.numel();
  for (int64_t at = 0; at < n; at += kChunk)
    if (!all_finite(flat.narrow(0, at, std::min(kChunk, n - at)))) return false;
  return true;
}

struct dim {
  int64_t size, stride;
};

// Dimensions that select distinct elements: size-1 and stride-0 (broadcast) ones add
// none, so a view and its reduced form hold the same set of storage elements.
std::vector<dim> reduced_dims(const at::Tensor& t) {
  std::vector<dim> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) != 0) dims.push_back({t.size(d), t.stride(d)});
  std::sort(dims.begin(), dims.end(), [](const dim& a, const dim& b) { return a.stride < b.stride; });
  return dims;
}

bool non_overlapping(const std::vector<dim>& dims) {
  int64_t reach = 0;  // largest offset the smaller-stride dims reach
  for (const dim& d : dims) {
    if (d.stride <= reach) return false;
    reach += (d.size - 1) * d.stride;
  }
  return true;
}

// A view whose elements are distinct: at most as many as the storage holds. Checked in
// slices of the outermost dimension.
bool distinct_view_finite(const at::Tensor& whole, int64_t offset, std::vector<dim> dims) {
  std::reverse(dims.begin(), dims.end());  // outermost first
  std::vector<int64_t> sizes, strides;
  for (const dim& d : dims) sizes.push_back(d.size), strides.push_back(d.stride);
  if (dims.empty()) return all_finite(whole.narrow(0, offset, 1));
  at::Tensor view = whole.as_strided(sizes, strides, offset);
  const int64_t inner = std::max<int64_t>(1, view.numel() / sizes[0]);
  const int64_t rows = std::max<int64_t>(1, kChunk / inner);
  for (int64_t r = 0; r < sizes[0]; r += rows)
    if (!all_finite(view.narrow(0, r, std::min(rows, sizes[0] - r)))) return false;
  return true;
}

// A view whose elements repeat (as_strided with overlapping strides): the storage span it
// covers is marked with the offsets the view reaches (a sliding window per stride class,
// O(span) per dimension), and those are compared with the non-finite ones. Memory is a
// few bytes per element of the span, which lies inside the storage.
bool overlapping_view_finite(const at::Tensor& whole, int64_t offset, const std::vector<dim>& dims) {
  int64_t span = 1;
  for (const dim& d : dims) span += (d.size - 1) * d.stride;
  std::vector<uint8_t> bad(size_t(span), 0);
  for (int64_t at = 0; at < span; at += kChunk) {
    int64_t n = std::min(kChunk, span - at);
    at::Tensor mask = at::logical_not(at::isfinite(probe(whole.narrow(0, offset + at, n)))).to(at::kCPU).contiguous();
    std::memcpy(bad.data() + at, mask.data_ptr<bool>(), size_t(n));
  }
  std::vector<uint8_t> reach(size_t(span), 0), next(size_t(span), 0);
  reach[0] = 1;
  for (const dim& d : dims) {
    for (int64_t r = 0; r < d.stride && r < span; ++r) {
      int64_t window = 0;  // reached offsets among the last d.size positions of this class
      for (int64_t x = r, k = 0; x < span; x += d.stride, ++k) {
        window += reach[size_t(x)];
        if (k >= d.size) window -= reach[size_t(x - d.size * d.stride)];
        next[size_t(x)] = window > 0;
      }
    }
    reach.swap(next);
  }
  for (int64_t x = 0; x < span; ++x)
    if (reach[size_t(x)] && bad[size_t(x)]) return false;
  return true;
}

}  // namespace

std::vector<std::string> non_finite(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<std::string> bad;
  std::map<std::pair<const void*, c10::ScalarType>, bool> storage_finite;
  for (const auto& [name, t] : tensors) {
    if (t.is_meta() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
    if (t.layout() != at::kStrided) {  // sparse: every stored value (unstored ones are zero)
      if (!flat_finite((t.layout() == at::kSparse ? t._values() : t.values()).reshape({-1}))) bad.push_back(name);
      continue;
    }
    at::Tensor whole = whole_storage(t);
    auto key = std::make_pair(static_cast<const void*>(t.storage().unsafeGetStorageImpl()), t.scalar_type());
    auto it = storage_finite.find(key);
    if (it == storage_finite.end()) it = storage_finite.emplace(key, flat_finite(whole)).first;
    if (it->second) continue;
    std::vector<dim> dims = reduced_dims(t);
    bool finite = non_overlapping(dims) ? distinct_view_finite(whole, t.storage_offset(), dims)
                                        : overlapping_view_finite(whole, t.storage_offset(), dims);
    if (!finite) bad.push_back(name);
  }
  return bad;
}

}  // namespace ckpt::detail
