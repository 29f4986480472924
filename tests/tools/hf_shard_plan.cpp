// Test helper: runs ckpt::hf::plan_shards (or parse_max_shard_size) on a JSON description
// and prints the result in the shape of huggingface_hub's StateDictSplit, so the tests can
// compare it with split_torch_state_dict_into_shards.
//   hf_shard_plan DESC
//     {"max_shard_size": "5GB" | n, "pattern": s (optional),
//      "tensors": [[key, storage id | null, storage bytes], ...]}
//   -> {"ok": true, "is_sharded", "metadata": {"total_size"},
//       "filename_to_tensors": [[file, [keys]]...], "tensor_to_filename": [[key, file]...]}
//     {"sizes": ["5GB", ...]} -> {"ok": true, "sizes": [n | {"kind"}...]}
// Exit status 0, or the ckptool exit code of the error kind ({"ok": false, "kind"}).
#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "formats/hf_shard_plan.h"

using json = nlohmann::ordered_json;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hf_shard_plan DESC\n");
    return 2;
  }
  try {
    std::ifstream f(argv[1]);
    const json desc = json::parse(f);
    json out;
    out["ok"] = true;
    if (desc.contains("sizes")) {
      auto& sizes = out["sizes"] = json::array();
      for (const auto& s : desc["sizes"]) {
        try {
          sizes.push_back(ckpt::hf::parse_max_shard_size(s.get<std::string>()));
        } catch (const ckpt::error& e) {
          sizes.push_back(json{{"kind", ckpt::errc_name(e.kind())}});
        }
      }
      std::cout << out.dump() << "\n";
      return 0;
    }
    const json& m = desc.at("max_shard_size");
    const uint64_t max = m.is_string() ? ckpt::hf::parse_max_shard_size(m.get<std::string>()) : m.get<uint64_t>();
    std::vector<ckpt::hf::shard_tensor> tensors;
    for (const auto& t : desc.at("tensors")) {
      ckpt::hf::shard_tensor s;
      s.key = t.at(0).get<std::string>();
      if (!t.at(1).is_null()) s.storage = t.at(1).get<uint64_t>();
      s.storage_nbytes = t.at(2).get<uint64_t>();
      tensors.push_back(std::move(s));
    }
    const auto plan = desc.contains("pattern")
                          ? ckpt::hf::plan_shards(tensors, max, desc["pattern"].get<std::string>())
                          : ckpt::hf::plan_shards(tensors, max);
    out["is_sharded"] = plan.is_sharded();
    out["metadata"] = {{"total_size", plan.total_size}};
    // Built apart: a reference into an ordered_json dies when a key is added beside it.
    json files = json::array(), by_key = json::array();
    for (size_t s = 0; s < plan.files.size(); ++s) {
      json keys = json::array();
      for (size_t i : plan.file_tensors[s]) {
        keys.push_back(tensors[i].key);
        by_key.push_back({tensors[i].key, plan.files[s]});
      }
      files.push_back({plan.files[s], keys});
    }
    out["filename_to_tensors"] = std::move(files);
    out["tensor_to_filename"] = std::move(by_key);
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const ckpt::error& e) {
    std::cout << json{{"ok", false}, {"kind", ckpt::errc_name(e.kind())}, {"message", e.one_line()}}.dump(
                     -1, ' ', false, json::error_handler_t::replace)
              << "\n";
    return ckpt::exit_code(e.kind());
  }
}
