// The CUDA loader's staging pipeline, run on CPU memory against the hostile copy engine
// (hostile_copy_engine.h): every byte lands exactly (handmade layouts and the sample
// checkpoints), a failing copy or read surfaces as one error naming the file with nothing
// left in flight, cancellation stops cleanly, and the deliberately broken variant that
// reuses a staging buffer before its copies are done is caught.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "hostile_copy_engine.h"
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
