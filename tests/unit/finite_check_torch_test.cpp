// --check-finite's scan (src/torch/finite_check.cpp): exact per view, sized by storages.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "torch_doctest.h"

#include "torch/finite_check.h"

using ckpt::detail::non_finite;
using named = std::vector<std::pair<std::string, at::Tensor>>;

TEST_CASE("finite check: a view is named only for its own elements") {
  at::Tensor s = at::arange(12, at::kFloat);
  s[5] = NAN;
  named t = {
      {"whole", s},
      {"evens", s.as_strided({6}, {2}, 0)},                 // 0, 2, ..., 10: no NaN
      {"odds", s.as_strided({6}, {2}, 1)},                  // 1, 3, 5, ...: NaN
      {"overlap_clean", s.as_strided({3, 3}, {1, 1}, 6)},   // 6..10
      {"overlap_bad", s.as_strided({3, 3}, {1, 1}, 3)},     // 3..7
      {"skip_bad", s.as_strided({2, 2}, {4, 1}, 0)},        // 0, 1, 4, 5: NaN
      {"skip_clean", s.as_strided({2, 2}, {6, 1}, 0)},      // 0, 1, 6, 7
      {"coprime", s.as_strided({3, 2}, {3, 2}, 0)},         // 0, 2, 3, 5, 6, 8: NaN, strides interleaved
      {"broadcast", s.as_strided({1000000, 1000000}, {0, 0}, 4)},
      {"broadcast_bad", s.as_strided({1000000, 1000000}, {0, 0}, 5)},
  };
  std::vector<std::string> want = {"whole", "odds", "overlap_bad", "skip_bad", "coprime", "broadcast_bad"};
  CHECK(non_finite(t) == want);
}

TEST_CASE("finite check: a clean storage is scanned once, whatever the views' sizes") {
  at::Tensor one = at::ones({1}, at::kDouble);
  named t = {{"huge", one.expand({1ll << 30, 1ll << 30})}, {"int", at::zeros({4}, at::kLong)}};
  CHECK(non_finite(t).empty());
  at::Tensor inf = at::full({1}, INFINITY, at::kBFloat16);
  CHECK(non_finite({{"inf", inf.expand({1ll << 20, 1ll << 20})}}) == std::vector<std::string>{"inf"});
}
