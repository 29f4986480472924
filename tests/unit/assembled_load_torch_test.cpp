// Keys assembled from pieces (a DCP tensor written as boxes by several ranks), loaded by
// load_tensors, materialize and load_module. The pieces and the tensors they were cut from
// were written by real torch and safetensors (tests/data/assembled/make_assembled.py); the
// test makes keys of the pieces by hand, as the DCP reader does, and compares what ckptool
// assembles byte for byte with the tensors torch wrote whole. Pieces of the wrong dtype,
// boxes outside the shape, overlapping or leaving elements unwritten are refused.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "torch_doctest.h"

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/load.h"
#include "ckpt/materialize.h"
#include "ckpt/output_set.h"

namespace {

using ckpt::dtype;

const std::string kDir = std::string(CKPT_SOURCE_DIR) + "/tests/data/assembled/";

struct fixture {
  ckpt::checkpoint c;
  std::map<std::string, size_t> record;       // tensor name -> record
  std::map<std::string, at::Tensor> full;     // "dim0" -> the tensor torch wrote whole
};

fixture open_fixture() {
  fixture f;
  f.c = ckpt::open_checkpoint(kDir + "pieces.safetensors");
  for (size_t i = 0; i < f.c.tensors.size(); ++i) f.record[ckpt::path_to_string(f.c.tensors[i].path)] = i;
  ckpt::load_options o;
  for (auto& [name, t] : ckpt::load_tensors(f.c, o))
    if (name.rfind("full.", 0) == 0) f.full[name.substr(5)] = t;
  REQUIRE(f.full.size() == 9);
  return f;
}

ckpt::tensor_piece piece(const fixture& f, const std::string& name, std::vector<int64_t> offsets) {
  return {f.record.at(name), std::move(offsets)};
}

// The keys make_assembled.py cut: every tensor, from its pieces at their boxes.
ckpt::key_table assembled_keys(const fixture& f, const std::string& prefix = "") {
  ckpt::key_table k;
  k.add(prefix + "dim0", dtype::float32, {6, 5}, {piece(f, "p.dim0.0", {0, 0}), piece(f, "p.dim0.1", {2, 0})});
  k.add(prefix + "dim1", dtype::float32, {4, 6}, {piece(f, "p.dim1.0", {0, 0}), piece(f, "p.dim1.1", {0, 2})});
  // Listed out of order: the boxes place them.
  k.add(prefix + "grid", dtype::float64, {5, 7},
        {piece(f, "p.grid.3", {2, 3}), piece(f, "p.grid.0", {0, 0}), piece(f, "p.grid.2", {2, 0}),
         piece(f, "p.grid.1", {0, 3})});
  k.add(prefix + "cube", dtype::int32, {3, 4, 5},
        {piece(f, "p.cube.0", {0, 0, 0}), piece(f, "p.cube.1", {0, 0, 3}), piece(f, "p.cube.2", {0, 2, 0}),
         piece(f, "p.cube.3", {0, 2, 3})});
  k.add(prefix + "bf", dtype::bfloat16, {3, 8}, {piece(f, "p.bf.0", {0, 0}), piece(f, "p.bf.1", {0, 5})});
  k.add(prefix + "halves", dtype::float16, {4, 3},
        {piece(f, "p.halves.1", {4, 0}), piece(f, "p.halves.0", {0, 0}), piece(f, "p.halves.2", {0, 3})});
  k.add(prefix + "scalar", dtype::float32, {}, {piece(f, "p.scalar.0", {})});
  k.add(prefix + "whole", dtype::int64, {8}, {piece(f, "p.whole.0", {0})});
  k.add(prefix + "nan", dtype::float32, {2, 4}, {piece(f, "p.nan.0", {0, 0}), piece(f, "p.nan.1", {0, 2})});
  return k;
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.nbytes())) == 0;
}

std::map<std::string, at::Tensor> by_name(std::vector<std::pair<std::string, at::Tensor>> v) {
  std::map<std::string, at::Tensor> out;
  for (auto& [n, t] : v) out[n] = t;
  return out;
}

ckpt::errc failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ckpt::error& e) {
    MESSAGE(std::string(e.what()));
    return e.kind();
  }
  FAIL("no error");
  return ckpt::errc::usage;
}

}  // namespace

TEST_CASE("load_tensors assembles every key from its pieces exactly as torch cut them") {
  fixture f = open_fixture();
  f.c.keys = assembled_keys(f);
  for (int threads : {1, 3}) {
    CAPTURE(threads);
    ckpt::load_options o;
    o.threads = threads;
    uint64_t last_done = 0, last_total = 0;
    o.progress = [&](uint64_t done, uint64_t total) {
      last_done = std::max(last_done, done);
      last_total = total;
    };
    auto got = by_name(ckpt::load_tensors(f.c, o));
    for (const auto& entry : f.full) {
      const std::string& name = entry.first;  // CAPTURE's lambda cannot capture a binding
      const at::Tensor& want = entry.second;
      CAPTURE(name);
      REQUIRE(got.count(name));
      CHECK(same_bytes(got[name], want));
      CHECK(got[name].is_contiguous());
    }
    // The pieces are parts of their keys' tensors, not tensors of their own.
    for (const auto& [name, t] : got) CHECK(name.rfind("p.", 0) != 0);
    CHECK(last_done == last_total);
  }
}

TEST_CASE("assembled keys: meta plans without reading, --dtype casts, --mmap maps only a whole piece") {
  fixture f = open_fixture();
  f.c.keys = assembled_keys(f);
  {
    ckpt::load_options o;
    o.device = c10::Device(c10::kMeta);
    auto got = by_name(ckpt::load_tensors(f.c, o));
    for (const auto& entry : f.full) {
      const std::string& name = entry.first;  // CAPTURE's lambda cannot capture a binding
      const at::Tensor& want = entry.second;
      CAPTURE(name);
      CHECK(got[name].is_meta());
      CHECK((got[name].sizes() == want.sizes()));
      CHECK((got[name].scalar_type() == want.scalar_type()));
    }
  }
  {
    ckpt::load_options o;
    o.dtype = at::kBFloat16;
    std::vector<std::string> converted;
    auto got = by_name(ckpt::load_tensors(f.c, o, &converted));
    CHECK(same_bytes(got["dim1"], f.full["dim1"].to(at::kBFloat16)));
    CHECK(same_bytes(got["grid"], f.full["grid"].to(at::kBFloat16)));
    CHECK(same_bytes(got["cube"], f.full["cube"]));  // integers keep their type
    CHECK(std::find(converted.begin(), converted.end(), "dim1: float32 -> bfloat16") != converted.end());
  }
  {
    ckpt::load_options o;
    o.mmap = true;
    o.populate = true;
    // A mapping shows file bytes in file order: pieces at several places cannot be one tensor.
    CHECK(failure_of([&] { ckpt::load_tensors(f.c, o); }) == ckpt::errc::unsupported);
    ckpt::key_table k;
    k.add("whole", dtype::int64, {8}, {piece(f, "p.whole.0", {0})});
    k.add("scalar", dtype::float32, {}, {piece(f, "p.scalar.0", {})});
    f.c.keys = std::move(k);
    auto got = by_name(ckpt::load_tensors(f.c, o));
    CHECK(same_bytes(got["whole"], f.full["whole"]));
    CHECK(same_bytes(got["scalar"], f.full["scalar"]));
  }
}

TEST_CASE("materialize: --check-finite finds a NaN in a piece, -o writes the assembled tensors") {
  fixture f = open_fixture();
  f.c.keys = assembled_keys(f);
  const std::string out = "/tmp/ckpt_assembled_" + std::to_string(::getpid()) + ".pt";
  {
    ckpt::output_set set;
    ckpt::materialize_request req;
    req.check_finite = true;
    ckpt::materialize_report r = ckpt::materialize(f.c, req);
    CHECK(std::find(r.non_finite.begin(), r.non_finite.end(), "nan") != r.non_finite.end());
    CHECK(std::find(r.non_finite.begin(), r.non_finite.end(), "dim1") == r.non_finite.end());
  }
  {
    ckpt::output_set set;
    ckpt::materialize_request req;
    req.output = &set.add_output(out);
    set.open();
    ckpt::materialize_report r = ckpt::materialize(f.c, req);
    REQUIRE(r.output_written);
    set.commit();
  }
  auto back = by_name(ckpt::load_tensors(out, ckpt::load_options()));
  std::remove(out.c_str());
  for (const auto& entry : f.full) {
    const std::string& name = entry.first;  // CAPTURE's lambda cannot capture a binding
    const at::Tensor& want = entry.second;
    CAPTURE(name);
    CHECK(same_bytes(back.at(name), want));
  }
}

TEST_CASE("load_module aligns assembled keys by their global shapes and fills the model") {
  fixture f = open_fixture();
  f.c.keys = assembled_keys(f, "module.");
  ckpt::module_load_report r;
  torch::jit::Module m = ckpt::load_module(kDir + "model.pt", f.c, ckpt::load_options(), true, &r);
  CHECK(r.missing.empty());
  CHECK(same_bytes(m.attr("dim0").toTensor(), f.full["dim0"]));
  CHECK(same_bytes(m.attr("dim1").toTensor(), f.full["dim1"]));
  CHECK(same_bytes(m.attr("cube").toTensor(), f.full["cube"]));
  CHECK(r.bytes == (30 + 24) * 4 + 60 * 4);
}

TEST_CASE("pieces that cannot make their key exactly are refused, never returned") {
  fixture f = open_fixture();
  ckpt::load_options o;
  auto refused = [&](ckpt::key_table k) {
    f.c.keys = std::move(k);
    return failure_of([&] { ckpt::load_tensors(f.c, o); });
  };
  ckpt::key_table k;
  // A float32 piece in a float64 key.
  k.add("x", dtype::float64, {6, 5}, {piece(f, "p.dim0.0", {0, 0}), piece(f, "p.dim0.1", {2, 0})});
  CHECK(refused(std::move(k)) == ckpt::errc::corrupt);
  k = {};
  // A box past the shape's end (columns 2..6 of 6).
  k.add("x", dtype::float32, {4, 6}, {piece(f, "p.dim1.0", {0, 0}), piece(f, "p.dim1.1", {0, 3})});
  CHECK(refused(std::move(k)) == ckpt::errc::corrupt);
  k = {};
  // A negative offset.
  k.add("x", dtype::float32, {4, 6}, {piece(f, "p.dim1.0", {0, -1}), piece(f, "p.dim1.1", {0, 2})});
  CHECK(refused(std::move(k)) == ckpt::errc::corrupt);
  k = {};
  // Overlapping boxes whose sizes add up to the tensor's.
  k.add("x", dtype::float32, {6, 5}, {piece(f, "p.dim0.0", {0, 0}), piece(f, "p.dim0.1", {1, 0})});
  CHECK(refused(std::move(k)) == ckpt::errc::corrupt);
  k = {};
  // Rows 0 and 1 left unwritten.
  k.add("x", dtype::float32, {6, 5}, {piece(f, "p.dim0.1", {2, 0})});
  CHECK(refused(std::move(k)) == ckpt::errc::corrupt);
  k = {};
  // A piece of a rank the shape does not have.
  k.add("x", dtype::float32, {30}, {piece(f, "p.dim0.0", {0}), piece(f, "p.dim0.1", {10})});
  CHECK(refused(std::move(k)) == ckpt::errc::corrupt);
  k = {};
  // One storage at two boxes: read into one place only, so refused rather than copied.
  k.add("x", dtype::float32, {4, 5}, {piece(f, "p.dim0.0", {0, 0}), piece(f, "p.dim0.0", {2, 0})});
  CHECK(refused(std::move(k)) == ckpt::errc::unsupported);
  k = {};
  // A piece that is also a tensor the result holds under its own key.
  k.add("x", dtype::float32, {6, 5}, {piece(f, "p.dim0.0", {0, 0}), piece(f, "p.dim0.1", {2, 0})});
  k.add("y", f.record.at("p.dim0.0"));
  CHECK(refused(std::move(k)) == ckpt::errc::unsupported);
}

TEST_CASE("large pieces: a dim-0 shard is read straight into its tensor, a dim-1 shard through the bounce buffer") {
  // Pieces of megabytes get reads of their own (small ones share one, through the bounce
  // buffer), and reads are cut at multiples of 16 MiB in the file: both paths, cut mid-piece.
  const std::string path = "/tmp/ckpt_assembled_large_" + std::to_string(::getpid()) + ".pt";
  const at::Tensor rows = at::arange(int64_t(3072) * 1536, at::kFloat).reshape({3072, 1536});
  const at::Tensor cols = at::arange(int64_t(1536) * 3072, at::kFloat).reshape({1536, 3072}).neg();
  const std::vector<at::Tensor> pieces = {rows.narrow(0, 0, 1000).clone(), rows.narrow(0, 1000, 2072).clone(),
                                          cols.narrow(1, 0, 1000).clone(), cols.narrow(1, 1000, 2072).clone()};
  ckpt::save_tensors({{"r0", pieces[0]}, {"r1", pieces[1]}, {"c0", pieces[2]}, {"c1", pieces[3]}}, path);
  ckpt::checkpoint c = ckpt::open_checkpoint(path);
  std::remove(path.c_str());  // the open file stays readable
  std::map<std::string, size_t> record;
  for (size_t i = 0; i < c.tensors.size(); ++i) record[ckpt::path_to_string(c.tensors[i].path)] = i;
  ckpt::key_table k;
  k.add("rows", dtype::float32, {3072, 1536}, {{record.at("r0"), {0, 0}}, {record.at("r1"), {1000, 0}}});
  k.add("cols", dtype::float32, {1536, 3072}, {{record.at("c1"), {0, 1000}}, {record.at("c0"), {0, 0}}});
  c.keys = std::move(k);
  for (int threads : {1, 4}) {
    CAPTURE(threads);
    ckpt::load_options o;
    o.threads = threads;
    auto got = by_name(ckpt::load_tensors(c, o));
    REQUIRE(got.size() == 2);
    CHECK(same_bytes(got["rows"], at::cat({pieces[0], pieces[1]}, 0)));
    CHECK(same_bytes(got["cols"], at::cat({pieces[2], pieces[3]}, 1)));
  }
}
