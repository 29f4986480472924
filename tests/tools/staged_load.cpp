// Test helper: loads every storage of a checkpoint through the CUDA loader's staging
// pipeline (src/io/staging_pipeline.h), with CPU memory standing in for device memory and
// the hostile copy engine (tests/unit/hostile_copy_engine.h) standing in for CUDA, then
// writes the storages' bytes to OUT (concatenated in storage order) and prints JSON
// (strings as hex) saying where each storage is in OUT and which storage each tensor views, so that
// tests/py/test_staged_pipeline.py can compare every byte with torch.load's.
//   staged_load CKPT OUT [--seed N] [--slots N] [--slot-bytes N] [--threads N] [--hold N]
//                        [--fail-at N] [--too-early]
// --too-early runs the deliberately broken pipeline (buffers reused before their copies
// are done). Exit status: 0, or the ckptool exit code of the error kind (OUT not written).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../unit/hostile_copy_engine.h"
#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "model/read_plan.h"
#include "io/staging_pipeline.h"

using namespace ckpt::detail;

namespace {

// Strings as hex of their bytes: a key may be any Python str, lone surrogates included,
// which JSON text cannot carry.
std::string hex(const std::string& s) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char ch : s) {
    out += digits[ch >> 4];
    out += digits[ch & 15];
  }
  return out;
}

nlohmann::json path_json(const ckpt::value_path& path) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& step : path) {
    if (std::holds_alternative<std::string>(step))
      out.push_back({{"hex", hex(std::get<std::string>(step))}});
    else
      out.push_back(std::get<int64_t>(step));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: staged_load CKPT OUT [--seed N] [--slots N] [--slot-bytes N] [--threads N] "
                         "[--hold N] [--fail-at N] [--too-early]\n");
    return 2;
  }
  ckpt::testing::hostile_copy_engine::options eo;
  size_t slots = 2;
  uint64_t slot_bytes = 4096;
  int threads = 3;
  bool too_early = false;
  for (int i = 3; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--too-early") {
      too_early = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "staged_load: %s needs a value\n", flag.c_str());
      return 2;
    }
    const unsigned long long v = std::stoull(argv[++i]);
    if (flag == "--seed") eo.seed = uint32_t(v);
    else if (flag == "--slots") slots = size_t(v);
    else if (flag == "--slot-bytes") slot_bytes = v;
    else if (flag == "--threads") threads = int(v);
    else if (flag == "--hold") eo.hold = size_t(v);
    else if (flag == "--fail-at") eo.fail_at = v;
    else {
      std::fprintf(stderr, "staged_load: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    ckpt::checkpoint c = ckpt::open_checkpoint(argv[1]);
    read_plan_options po;
    po.max_read = slot_bytes;
    const read_plan plan = plan_reads(c, std::vector<bool>(c.storages.size(), true), po);

    std::vector<std::vector<uint8_t>> storages(c.storages.size());
    std::vector<uint8_t*> destinations(c.storages.size(), nullptr);
    for (size_t i : plan.storages) {
      storages[i].assign(size_t(c.storages[i].nbytes), 0xEE);  // never what a checkpoint holds everywhere
      destinations[i] = storages[i].data();
    }
    std::vector<uint8_t> ring_memory(slots * slot_bytes);
    const staging_ring ring{ring_memory.data(), slots, slot_bytes};
    staging_options so;
    so.threads = threads;
    uint64_t submitted = 0;
    {
      ckpt::testing::hostile_copy_engine engine(eo);
      if (too_early)
        run_staging_pipeline<slot_reuse::too_early>(plan, ckpt::detail::file_sources(c), destinations, ring, engine, so);
      else
        run_staging_pipeline<slot_reuse::after_copy>(plan, ckpt::detail::file_sources(c), destinations, ring, engine, so);
      submitted = engine.submitted();
    }

    nlohmann::json out;
    out["byteorder"] = c.byteorder;
    out["reads"] = plan.reads.size();
    out["submitted"] = submitted;
    auto& js = out["storages"] = nlohmann::json::array();
    std::ofstream bin(argv[2], std::ios::binary | std::ios::trunc);
    uint64_t at = 0;
    for (size_t i = 0; i < c.storages.size(); ++i) {
      js.push_back({{"index", i}, {"at", at}, {"nbytes", storages[i].size()}, {"in_file", bool(c.storages[i].file_offset)}});
      bin.write(reinterpret_cast<const char*>(storages[i].data()), std::streamsize(storages[i].size()));
      at += storages[i].size();
    }
    if (!bin) throw ckpt::error(ckpt::errc::io, std::string("cannot write ") + argv[2]);
    std::vector<std::string> key_of(c.tensors.size());
    std::vector<bool> keyed(c.tensors.size(), false);
    for (size_t k = 0; k < c.keys.size(); ++k) {
      const size_t t = c.keys.tensor(k);
      key_of[t] = std::string(c.keys.key(k));
      keyed[t] = true;
    }
    auto& jt = out["tensors"] = nlohmann::json::array();
    for (size_t t = 0; t < c.tensors.size(); ++t) {
      const ckpt::tensor_record& r = c.tensors[t];
      if (!r.storage) continue;
      jt.push_back({{"path", path_json(r.path)},
                    {"key", keyed[t] ? nlohmann::json(hex(key_of[t])) : nlohmann::json()},
                    {"storage", *r.storage}});
    }
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "staged_load: %s\n", e.one_line().c_str());
    return ckpt::exit_code(e.kind());
  }
}
