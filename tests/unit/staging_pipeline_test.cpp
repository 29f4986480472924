// The CUDA loader's staging pipeline, run on CPU memory against the hostile copy engine
// (hostile_copy_engine.h): every byte lands exactly (handmade layouts and the sample
// checkpoints), a failing copy or read surfaces as one error naming the file with nothing
// left in flight, cancellation stops cleanly, and the deliberately broken variant that
// reuses a staging buffer before its copies are done is caught.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "hostile_copy_engine.h"
#include "model/assembly.h"
#include "model/read_plan.h"
#include "io/staging_pipeline.h"

using namespace ckpt::detail;
using ckpt::testing::hostile_copy_engine;

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 r(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = uint8_t(r());
  return out;
}

// Storages of random sizes (some zero, some longer than a staging buffer) with random gaps.
ckpt::checkpoint random_layout(uint32_t seed, uint64_t file_size, size_t count) {
  std::mt19937 r(seed);
  ckpt::checkpoint c;
  c.files.emplace_back();  // storages are in file 0, whose bytes each test passes itself
  uint64_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    ckpt::storage_record s;
    s.nbytes = r() % 4 == 0 ? 0 : 1 + r() % 9000;
    at += r() % 3 == 0 ? 0 : r() % 200;
    if (at + s.nbytes > file_size) break;
    s.file_offset = at;
    at += s.nbytes;
    c.storages.push_back(s);
  }
  return c;
}

struct result {
  std::vector<std::vector<uint8_t>> storages;
  uint64_t last_progress = 0;
};

template <slot_reuse reuse = slot_reuse::after_copy>
result stage(const ckpt::checkpoint& c, const ckpt::byte_source& file, hostile_copy_engine& engine, size_t slots,
             uint64_t slot_bytes, int threads, std::atomic<bool>* cancel_on_progress = nullptr) {
  read_plan_options po;
  po.max_read = slot_bytes;
  read_plan plan = plan_reads(c, std::vector<bool>(c.storages.size(), true), po);
  result out;
  out.storages.resize(c.storages.size());
  std::vector<uint8_t*> dst(c.storages.size(), nullptr);
  for (size_t i : plan.storages) {
    out.storages[i].assign(c.storages[i].nbytes, 0xEE);
    dst[i] = out.storages[i].data();
  }
  std::vector<uint8_t> ring_memory(slots * slot_bytes);
  staging_ring ring{ring_memory.data(), slots, slot_bytes};
  staging_options so;
  so.threads = threads;
  so.cancel = cancel_on_progress;
  std::atomic<uint64_t> last{0};
  std::atomic<bool> over{false};  // doctest's CHECK is not for other threads
  so.progress = [&](uint64_t done, uint64_t total) {
    if (done > total) over = true;
    if (cancel_on_progress) *cancel_on_progress = true;
    uint64_t seen = last.load();
    while (done > seen && !last.compare_exchange_weak(seen, done)) {
    }
  };
  run_staging_pipeline<reuse>(plan, {&file}, dst, ring, engine, so);
  out.last_progress = last;
  CHECK_FALSE(over);
  return out;
}

size_t mismatched_storages(const ckpt::checkpoint& c, const ckpt::byte_source& file, const result& r) {
  size_t bad = 0;
  for (size_t i = 0; i < c.storages.size(); ++i) {
    const auto& s = c.storages[i];
    if (!s.file_offset || s.nbytes == 0) continue;
    std::vector<uint8_t> want = file.read_vector(*s.file_offset, size_t(s.nbytes));
    if (r.storages[i] != want) ++bad;
  }
  return bad;
}

uint64_t data_bytes(const ckpt::checkpoint& c) {
  uint64_t n = 0;
  for (const auto& s : c.storages)
    if (s.file_offset) n += s.nbytes;
  return n;
}

}  // namespace

TEST_CASE("every byte lands exactly, whatever order and thread the copies complete in") {
  const std::vector<uint8_t> bytes = random_bytes(1 << 20, 7);
  ckpt::memory_source file(bytes, "random.bin");
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    ckpt::checkpoint c = random_layout(seed, bytes.size(), 400);
    REQUIRE(c.storages.size() > 100);
    hostile_copy_engine::options eo;
    eo.seed = seed;
    eo.max_delay_us = 20;
    eo.hold = seed % 3;  // 0: copies run as soon as they can; 2: two are always held back
    hostile_copy_engine engine(eo);
    const size_t slots = 1 + seed % 4;
    const int threads = 1 + int(seed % 3);
    result r = stage(c, file, engine, slots, 16 << 10, threads);
    CHECK(mismatched_storages(c, file, r) == 0);
    CHECK(r.last_progress == data_bytes(c));
    CHECK(engine.outstanding() == 0);
    CHECK(engine.waited() == engine.submitted());
  }
}

TEST_CASE("the sample checkpoints land bit for bit") {
  for (const char* name : {"samples/compiled_lightning.ckpt", "samples/plain.pt", "samples/model.safetensors", "samples/scripted.pt"}) {
    const std::string path = std::string(CKPT_SOURCE_DIR) + "/" + name;
    CAPTURE(path);
    ckpt::checkpoint c;
    try {
      c = ckpt::open_checkpoint(path);
    } catch (const ckpt::error& e) {
      if (e.kind() == ckpt::errc::io) continue;  // a sample this checkout does not have
      throw;
    }
    hostile_copy_engine engine({3, 50, 1, std::nullopt, 0xA5});
    // Buffers smaller than most records: records are cut and many reads share two buffers.
    const ckpt::byte_source& file = *c.single_file("the test").source;
    result r = stage(c, file, engine, 2, 4096, 2);
    CHECK(mismatched_storages(c, file, r) == 0);
    CHECK(engine.outstanding() == 0);
  }
}

TEST_CASE("the hostile engine catches a pipeline that reuses a buffer before its copies are done") {
  const std::vector<uint8_t> bytes = random_bytes(256 << 10, 11);
  ckpt::memory_source file(bytes, "random.bin");
  ckpt::checkpoint c = random_layout(5, bytes.size(), 200);
  hostile_copy_engine::options eo;
  eo.hold = size_t(-1);  // copies run only when waited for: the broken variant waits at the end
  {
    hostile_copy_engine engine(eo);
    result good = stage<slot_reuse::after_copy>(c, file, engine, 2, 8 << 10, 2);
    CHECK(mismatched_storages(c, file, good) == 0);
  }
  {
    hostile_copy_engine engine(eo);
    result broken = stage<slot_reuse::too_early>(c, file, engine, 2, 8 << 10, 2);
    CHECK(mismatched_storages(c, file, broken) > 0);
    CHECK(engine.outstanding() == 0);  // even the broken variant leaves nothing in flight
  }
}

TEST_CASE("a failing copy is one error naming the file and range, with nothing left in flight") {
  const std::vector<uint8_t> bytes = random_bytes(512 << 10, 3);
  ckpt::memory_source file(bytes, "weights.pt");
  ckpt::checkpoint c = random_layout(9, bytes.size(), 300);
  const size_t reads = plan_reads(c, std::vector<bool>(c.storages.size(), true), {4096, 16 << 10}).reads.size();
  REQUIRE(reads > 10);
  for (uint64_t fail_at : {uint64_t(0), uint64_t(5), uint64_t(reads - 1)}) {
    CAPTURE(fail_at);
    hostile_copy_engine::options eo;
    eo.fail_at = fail_at;
    eo.seed = uint32_t(fail_at + 1);
    hostile_copy_engine engine(eo);
    try {
      stage(c, file, engine, 3, 16 << 10, 3);
      FAIL("a failed copy was reported as success");
    } catch (const ckpt::error& e) {
      CHECK(e.kind() == ckpt::errc::device);
      CHECK(e.file() == "weights.pt");
      CHECK(e.offset().has_value());
      CHECK(e.message().find("injected copy failure") != std::string::npos);
      CHECK(e.message().find("to their destination failed") != std::string::npos);
    }
    CHECK(engine.outstanding() == 0);
    CHECK(engine.waited() == engine.submitted());
  }
}

TEST_CASE("a failing read stops the pipeline and is rethrown as is") {
  const std::vector<uint8_t> bytes = random_bytes(64 << 10, 4);
  ckpt::memory_source file(bytes, "short.pt");
  ckpt::checkpoint c = random_layout(2, bytes.size(), 100);
  ckpt::storage_record past_end;
  past_end.file_offset = bytes.size() - 10;
  past_end.nbytes = 100;  // the metadata claims more than the file has
  c.storages.push_back(past_end);
  hostile_copy_engine engine({});
  CHECK_THROWS_WITH_AS(stage(c, file, engine, 2, 4096, 2), doctest::Contains("truncated"), ckpt::error);
  CHECK(engine.outstanding() == 0);
}

TEST_CASE("cancellation stops reading, waits for the copies in flight, and says interrupted") {
  const std::vector<uint8_t> bytes = random_bytes(256 << 10, 5);
  ckpt::memory_source file(bytes, "big.pt");
  ckpt::checkpoint c = random_layout(8, bytes.size(), 200);
  std::atomic<bool> cancel{false};  // set by the first progress report
  hostile_copy_engine engine({});
  CHECK_THROWS_WITH_AS(stage(c, file, engine, 2, 4096, 2, &cancel), doctest::Contains("interrupted"), ckpt::error);
  CHECK(cancel);
  CHECK(engine.submitted() < plan_reads(c, std::vector<bool>(c.storages.size(), true), {4096, 4096}).reads.size());
  CHECK(engine.outstanding() == 0);
}

// The pieces of assembled tensors (assembly.h): each piece is read into the staging ring
// and copied from there into the strided box of its tensor, as rows.
namespace {

struct assembled_layout {
  ckpt::checkpoint c;
  std::vector<uint8_t> file;                  // what the storages point into
  std::vector<std::vector<uint8_t>> tensors;  // by key: the global tensors cut into pieces
};

// Keys of random rank, shape and dtype, each cut into a random grid of boxes (some of
// them empty), the boxes written to the file in random order with random gaps.
assembled_layout random_assembled(uint32_t seed, size_t keys) {
  std::mt19937 r(seed);
  assembled_layout out;
  out.c.files.emplace_back();
  const ckpt::dtype types[] = {ckpt::dtype::uint8, ckpt::dtype::int16, ckpt::dtype::float32, ckpt::dtype::float64};
  for (size_t k = 0; k < keys; ++k) {
    const ckpt::dtype type = types[r() % 4];
    const uint64_t element = ckpt::element_size(type);
    const size_t rank = r() % 4;
    std::vector<int64_t> shape;
    std::vector<std::vector<int64_t>> cuts;  // per dimension: 0, ..., shape[d]
    uint64_t numel = 1;
    for (size_t d = 0; d < rank; ++d) {
      shape.push_back(1 + int64_t(r() % 9));
      numel *= uint64_t(shape[d]);
      std::vector<int64_t> at = {0, shape[d]};
      for (uint32_t n = r() % 3; n > 0; --n) at.push_back(int64_t(r() % uint64_t(shape[d] + 1)));  // repeats: empty boxes
      std::sort(at.begin(), at.end());
      cuts.push_back(at);
    }
    std::vector<uint8_t> tensor(numel * element);
    for (auto& b : tensor) b = uint8_t(r());
    std::vector<int64_t> stride(rank, 1);
    for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
    // Every box of the grid: its index in each dimension's cuts.
    std::vector<ckpt::tensor_piece> pieces;
    std::vector<size_t> index(rank, 0);
    for (;;) {
      std::vector<int64_t> offset(rank), size(rank);
      uint64_t box_numel = 1;
      for (size_t d = 0; d < rank; ++d) {
        offset[d] = cuts[d][index[d]];
        size[d] = cuts[d][index[d] + 1] - offset[d];
        box_numel *= uint64_t(size[d]);
      }
      ckpt::storage_record s;
      s.nbytes = box_numel * element;
      out.file.resize(out.file.size() + r() % 40, 0x77);
      s.file_offset = out.file.size();
      // The box's elements in row-major order.
      for (uint64_t e = 0; e < box_numel; ++e) {
        uint64_t rest = e, at = 0;
        for (size_t d = rank; d-- > 0;) {
          at += uint64_t(offset[d] + int64_t(rest % uint64_t(size[d]))) * uint64_t(stride[d]);
          rest /= uint64_t(size[d]);
        }
        out.file.insert(out.file.end(), tensor.begin() + long(at * element), tensor.begin() + long((at + 1) * element));
      }
      ckpt::tensor_record t;
      t.type = type;
      t.shape = size;
      std::vector<int64_t> box_stride(rank, 1);
      for (size_t d = rank; d-- > 1;) box_stride[d - 1] = box_stride[d] * size[d];
      t.stride = box_stride;
      t.storage = out.c.storages.size();
      out.c.storages.push_back(s);
      pieces.push_back({out.c.tensors.size(), offset});
      out.c.tensors.push_back(t);
      size_t d = rank;
      while (d > 0 && ++index[d - 1] + 1 == cuts[d - 1].size()) index[--d] = 0;
      if (d == 0) break;
    }
    std::shuffle(pieces.begin(), pieces.end(), r);
    out.c.keys.add("t" + std::to_string(k), type, shape, pieces);
    out.tensors.push_back(std::move(tensor));
  }
  return out;
}

// Stages every piece of `l` into tensors of its keys; returns them.
template <slot_reuse reuse = slot_reuse::after_copy>
std::vector<std::vector<uint8_t>> stage_pieces(const assembled_layout& l, hostile_copy_engine& engine, size_t slots,
                                               uint64_t slot_bytes, int threads, uint64_t* progress = nullptr) {
  ckpt::memory_source file(l.file, "pieces.distcp");
  std::vector<size_t> keys(l.c.keys.size());
  for (size_t k = 0; k < keys.size(); ++k) keys[k] = k;
  const assembly a = plan_assembly(l.c, keys);
  std::vector<std::vector<uint8_t>> out(l.c.keys.size());
  std::vector<uint8_t*> dst(l.c.storages.size(), nullptr);
  std::vector<const box_landing*> boxes(l.c.storages.size(), nullptr);
  std::vector<bool> needed(l.c.storages.size(), false);
  for (const assembled_tensor& t : a.tensors) {
    out[t.key].assign(t.nbytes + 1, 0xEE);  // + 1: a byte past the end that must stay untouched
    for (size_t s : t.storages) {
      dst[s] = out[t.key].data();
      boxes[s] = a.landing(s);
      needed[s] = true;
    }
  }
  read_plan_options po;
  po.max_read = slot_bytes;
  const read_plan plan = plan_reads(l.c, needed, po);
  std::vector<uint8_t> ring_memory(slots * slot_bytes);
  staging_options so;
  so.threads = threads;
  so.boxes = &boxes;
  std::atomic<uint64_t> last{0};
  so.progress = [&](uint64_t done, uint64_t) {
    uint64_t seen = last.load();
    while (done > seen && !last.compare_exchange_weak(seen, done)) {
    }
  };
  run_staging_pipeline<reuse>(plan, {&file}, dst, staging_ring{ring_memory.data(), slots, slot_bytes}, engine, so);
  if (progress) *progress = last;
  for (auto& t : out) {
    if (t.empty()) continue;
    CHECK(t.back() == 0xEE);
    t.pop_back();
  }
  return out;
}

size_t mismatched_tensors(const assembled_layout& l, const std::vector<std::vector<uint8_t>>& got) {
  size_t bad = 0;
  for (size_t k = 0; k < l.tensors.size(); ++k) bad += got[k] != l.tensors[k];
  return bad;
}

}  // namespace

TEST_CASE("pieces land in their boxes of the tensor, cut anywhere by the reads, copied out of order") {
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    CAPTURE(seed);
    const assembled_layout l = random_assembled(seed, 12);
    hostile_copy_engine::options eo;
    eo.seed = seed;
    eo.max_delay_us = 20;
    eo.hold = seed % 3;
    hostile_copy_engine engine(eo);
    // Buffers of a few dozen bytes: runs are cut mid-row, and rows span reads.
    const uint64_t slot_bytes = 24 + seed * 8;
    uint64_t progress = 0;
    const auto got = stage_pieces(l, engine, 1 + seed % 3, slot_bytes, 1 + int(seed % 3), &progress);
    CHECK(mismatched_tensors(l, got) == 0);
    uint64_t total = 0;
    for (const auto& t : l.tensors) total += t.size();
    CHECK(progress == total);
    CHECK(engine.outstanding() == 0);
    CHECK(engine.waited() == engine.submitted());
  }
}

TEST_CASE("pieces: the hostile engine catches early reuse, and a failing copy is one error") {
  const assembled_layout l = random_assembled(21, 16);
  {
    hostile_copy_engine::options eo;
    eo.hold = size_t(-1);
    hostile_copy_engine engine(eo);
    CHECK(mismatched_tensors(l, stage_pieces<slot_reuse::too_early>(l, engine, 2, 64, 2)) > 0);
    CHECK(engine.outstanding() == 0);
  }
  for (uint64_t fail_at : {uint64_t(0), uint64_t(7)}) {
    CAPTURE(fail_at);
    hostile_copy_engine::options eo;
    eo.fail_at = fail_at;
    hostile_copy_engine engine(eo);
    CHECK_THROWS_WITH_AS(stage_pieces(l, engine, 3, 64, 3), doctest::Contains("injected copy failure"), ckpt::error);
    CHECK(engine.outstanding() == 0);
    CHECK(engine.waited() == engine.submitted());
  }
}

TEST_CASE("plan_assembly lays boxes out as runs and refuses pieces that leave elements unwritten") {
  ckpt::checkpoint c;
  c.files.emplace_back();
  auto add_piece = [&](std::vector<int64_t> shape) {
    ckpt::storage_record s;
    s.nbytes = 4;
    for (int64_t d : shape) s.nbytes *= uint64_t(d);
    s.file_offset = 0;
    ckpt::tensor_record t;
    t.type = ckpt::dtype::float32;
    t.shape = shape;
    std::vector<int64_t> stride(shape.size(), 1);
    for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
    t.stride = stride;
    t.storage = c.storages.size();
    c.storages.push_back(s);
    c.tensors.push_back(t);
    return c.tensors.size() - 1;
  };
  // A [4, 6, 5] float32 tensor cut along dimension 1: [:, 0:2, :] and [:, 2:6, :].
  const size_t a = add_piece({4, 2, 5}), b = add_piece({4, 4, 5});
  c.keys.add("w", ckpt::dtype::float32, {4, 6, 5}, {{a, {0, 0, 0}}, {b, {0, 2, 0}}});
  const assembly plan = plan_assembly(c, {0});
  REQUIRE(plan.tensors.size() == 1);
  CHECK(plan.tensors[0].nbytes == 480);
  // Runs of 4 x 5 elements (the last dimension whole), one per index of dimension 0, a
  // row of the tensor (120 bytes) apart.
  const box_landing& l = *plan.landing(c.tensors[b].storage.value());
  CHECK(l.offset == 40);
  CHECK(l.run_bytes == 80);
  CHECK(l.counts == std::vector<uint64_t>{4});
  CHECK(l.pitches == std::vector<uint64_t>{120});
  // Bytes [70, 250) cut mid-run: the tail of run 0, runs 1 and 2 as rows, the head of run 3.
  std::vector<box_span> spans;
  for_each_span(l, 70, 180, [&](const box_span& s) { spans.push_back(s); });
  REQUIRE(spans.size() == 3);
  CHECK((spans[0].dst_offset == 40 + 70 && spans[0].width == 10 && spans[0].rows == 1));
  CHECK((spans[1].piece_offset == 80 && spans[1].dst_offset == 160 && spans[1].rows == 2 && spans[1].pitch == 120));
  CHECK((spans[2].piece_offset == 240 && spans[2].dst_offset == 400 && spans[2].width == 10));

  ckpt::key_table half;
  half.add("w", ckpt::dtype::float32, {4, 6, 5}, {{b, {0, 2, 0}}});
  c.keys = std::move(half);
  CHECK_THROWS_WITH_AS(plan_assembly(c, {0}), doctest::Contains("80 of its 120 elements"), ckpt::error);
}
