// Test helper: reads a Hugging Face `*.index.json` with ckpt::hf::parse_index and prints
// what it found as JSON; with --check, also opens every shard beside it (our own readers,
// metadata only) and prints the cross-check's findings.
//   hf_index_dump INDEX [--check]
// Exit status: 0, or the ckptool exit code of the error kind (the error as {"ok": false}).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "formats/hf_index.h"

namespace fs = std::filesystem;

namespace {

const char* kind_name(ckpt::hf::finding::what w) {
  using W = ckpt::hf::finding::what;
  switch (w) {
    case W::missing_shard: return "missing_shard";
    case W::key_missing_from_shard: return "key_missing_from_shard";
    case W::key_in_two_shards: return "key_in_two_shards";
    case W::key_not_in_index: return "key_not_in_index";
    case W::orphan_shard: return "orphan_shard";
    case W::total_size_mismatch: return "total_size_mismatch";
    case W::no_total_size: return "no_total_size";
  }
  return "?";
}

// The keys and storage bytes of one shard, read by ckptool's own readers.
ckpt::hf::shard_contents read_shard(const fs::path& dir, const std::string& name) {
  ckpt::hf::shard_contents s;
  s.name = name;
  fs::path p = dir / name;
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) {
    s.present = false;
    return s;
  }
  ckpt::checkpoint c = ckpt::open_checkpoint(p.string());
  for (size_t k = 0; k < c.keys.size(); ++k) s.keys.emplace_back(c.keys.key(k));
  for (const auto& st : c.storages) s.bytes += st.nbytes;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--check")) {
    std::fprintf(stderr, "usage: hf_index_dump INDEX [--check]\n");
    return 2;
  }
  std::string path = argv[1];
  bool check = argc == 3;
  nlohmann::json out;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ckpt::error(ckpt::errc::io, "cannot open");
    std::stringstream text;
    text << in.rdbuf();
    ckpt::hf::index idx;
    try {
      idx = ckpt::hf::parse_index(text.str());
    } catch (ckpt::error& e) {
      e.with_file(path);
      throw;
    }
    out["ok"] = true;
    out["shards"] = idx.shards;
    auto& wm = out["weight_map"] = nlohmann::json::array();
    for (const auto& [key, id] : idx.keys) wm.push_back({key, idx.shards[id]});
    out["total_size"] = idx.total_size ? nlohmann::json(*idx.total_size) : nlohmann::json();
    out["total_parameters"] = idx.total_parameters ? nlohmann::json(*idx.total_parameters) : nlohmann::json();
    out["has_metadata"] = idx.has_metadata;
    out["notes"] = idx.notes;
    if (check) {
      fs::path dir = fs::path(path).parent_path();
      std::vector<ckpt::hf::shard_contents> shards;
      for (const auto& name : idx.shards) shards.push_back(read_shard(dir, name));
      std::vector<std::string> listing;
      for (const auto& e : fs::directory_iterator(dir.empty() ? fs::path(".") : dir))
        if (e.is_regular_file()) listing.push_back(e.path().filename().string());
      for (const auto& name : ckpt::hf::orphan_candidates(idx, listing)) shards.push_back(read_shard(dir, name));
      ckpt::hf::cross_check_result r = ckpt::hf::cross_check(idx, shards);
      auto& fs_out = out["findings"] = nlohmann::json::array();
      for (const auto& f : r.findings)
        fs_out.push_back({{"kind", kind_name(f.kind)},
                          {"error", f.error},
                          {"key", f.key},
                          {"shard", f.shard},
                          {"other", f.other},
                          {"message", f.message}});
      out["errors"] = r.errors();
      out["warnings"] = r.warnings();
    }
    std::cout << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  } catch (const ckpt::error& e) {
    nlohmann::json err = {{"ok", false}, {"kind", ckpt::errc_name(e.kind())}, {"error", e.one_line()}};
    if (e.offset()) err["offset"] = *e.offset();
    std::cout << err.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return ckpt::exit_code(e.kind());
  }
}
