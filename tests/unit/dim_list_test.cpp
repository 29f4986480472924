// ckpt::dim_list, tensor_record's shape and stride: it must behave as the std::vector<int64_t>
// it replaced, on both sides of the switch from inline dimensions to a heap block.
#include <doctest/doctest.h>

#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dim_list.h"

using ckpt::dim_list;

TEST_SUITE("dim_list") {

TEST_CASE("reads and compares like a vector at every rank, inline or not") {
  for (size_t rank = 0; rank <= 7; ++rank) {
    std::vector<int64_t> v;
    for (size_t i = 0; i < rank; ++i) v.push_back(int64_t(i * 10 + 1));
    dim_list d = v;
    CHECK(d.size() == rank);
    CHECK(d.empty() == (rank == 0));
    CHECK(d == v);
    CHECK(v == d);
    CHECK(std::vector<int64_t>(d) == v);
    CHECK(d.vec() == v);
    size_t i = 0;
    for (int64_t x : d) CHECK(x == v[i++]);
    CHECK(i == rank);

    dim_list pushed;
    for (int64_t x : v) pushed.push_back(x);
    CHECK(pushed == d);

    dim_list copy = d;  // copies own their dimensions
    if (rank) copy[0] = -1;
    CHECK(d == v);
    CHECK((rank == 0 || copy != d));

    dim_list moved = std::move(copy);
    CHECK(moved.size() == rank);
    if (rank) CHECK(moved[0] == -1);

    dim_list assigned;
    assigned = moved;
    CHECK(assigned == moved);
    assigned = v;
    CHECK(assigned == d);
  }
}

TEST_CASE("assign, resize and the conversions call sites rely on") {
  dim_list d(4, 1);
  CHECK(d == std::vector<int64_t>{1, 1, 1, 1});
  d.resize(2);
  CHECK(d == std::vector<int64_t>{1, 1});
  d.assign(5, 7);
  CHECK(d.back() == 7);
  const std::vector<int64_t> src{3, 4};
  d.assign(src.begin(), src.end());
  CHECK(d == dim_list{3, 4});
  CHECK(d != dim_list{3, 4, 5});
  d = {9};
  CHECK(d.front() == 9);
  const std::vector<int64_t> as_vector = d;
  CHECK(as_vector == std::vector<int64_t>{9});
  // No heap block below rank 4: the point of the type.
  CHECK(sizeof(dim_list) == 32);
  CHECK(dim_list{1, 2, 3}.capacity() == dim_list::kInline);
}

TEST_CASE("tensor_record keeps shape and stride in dim_lists") {
  ckpt::tensor_record t;
  t.shape = std::vector<int64_t>{2, 3};
  t.stride = {3, 1};
  CHECK(t.numel() == 6);
  ckpt::tensor_record u = t;
  CHECK(u.shape == t.shape);
  CHECK(u.stride == std::vector<int64_t>{3, 1});
}

}  // TEST_SUITE
