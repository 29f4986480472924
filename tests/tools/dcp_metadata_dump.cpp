// Test helper: decodes a DCP `.metadata` file with ckpt::dcp::decode_metadata and prints it
// as JSON, which tests/py/test_dcp_metadata.py compares with what PyTorch's own
// FileSystemReader(dir).read_metadata() gives.
//   dcp_metadata_dump [--check] [--quiet] [--max-pickle-bytes N] FILE|DIR
// A directory means DIR/.metadata. --check also runs check_metadata (chunk coverage and
// the storage index; for a rank-local __N.metadata, the storage index only). Exit status: 0, or the ckptool exit code of the error, whose one
// line ("FILE: byte N: message") goes to stderr.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/byte_source.h"
#include "ckpt/dcp.h"
#include "ckpt/error.h"

namespace {

using json = nlohmann::ordered_json;

json path_json(const std::vector<ckpt::dcp::path_element>& path) {
  json out = json::array();
  for (const auto& e : path) out.push_back(e.is_index ? json(e.index) : json(e.key));
  return out;
}

json to_json(const ckpt::dcp::metadata& md) {
  json out;
  out["version"] = md.version ? json(*md.version) : json(nullptr);
  out["protocol"] = md.protocol;
  json& items = out["items"] = json::object();
  for (const auto& it : md.items) {
    if (!it.is_tensor) {
      items[it.fqn] = {{"type", "bytes"}};
      continue;
    }
    json chunks = json::array();
    for (const auto& c : it.tensor.chunks) chunks.push_back({{"offsets", c.offsets}, {"sizes", c.sizes}});
    items[it.fqn] = {{"type", "tensor"},
                     {"dtype", ckpt::name(it.tensor.type)},
                     {"size", it.tensor.size},
                     {"chunks", chunks},
                     {"layout", it.tensor.layout},
                     {"requires_grad", it.tensor.requires_grad},
                     {"memory_format", it.tensor.memory_format},
                     {"pin_memory", it.tensor.pin_memory}};
  }
  json& storage = out["storage"] = json::array();
  for (const auto& s : md.storage_data)
    storage.push_back({{"fqn", s.fqn},
                       {"offsets", s.offsets ? json(*s.offsets) : json(nullptr)},
                       {"index", s.index ? json(*s.index) : json(nullptr)},
                       {"relative_path", s.relative_path},
                       {"offset", s.offset},
                       {"length", s.length},
                       {"transform_descriptors", s.transform_descriptors}});
  if (md.planner_data_opaque) {
    out["planner_data"] = "opaque";
  } else if (!md.has_planner_data) {
    out["planner_data"] = nullptr;
  } else {
    json& pd = out["planner_data"] = json::object();
    for (const auto& p : md.planner_data) pd[p.fqn] = path_json(p.path);
  }
  if (md.writer_meta) {
    const auto& m = *md.writer_meta;
    out["storage_meta"] = {{"checkpoint_id", m.checkpoint_id},
                           {"save_id", m.save_id},
                           {"load_id", m.load_id ? json(*m.load_id) : json(nullptr)},
                           {"modules", m.modules}};
  } else {
    out["storage_meta"] = nullptr;
  }
  out["unknown_fields"] = md.unknown_fields;
  out["globals"] = md.globals;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool check = false;
  ckpt::dcp::decode_options options;
  bool quiet = false;  // decode (and check) only: for timing the decoder without the JSON
  std::string path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--check") check = true;
    else if (a == "--quiet") quiet = true;
    else if (a == "--max-pickle-bytes" && i + 1 < argc) options.lim.max_pickle_bytes = std::stoull(argv[++i]);
    else path = a;
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: dcp_metadata_dump [--check] FILE|DIR\n");
    return 2;
  }
  if (std::filesystem::is_directory(path)) path = (std::filesystem::path(path) / ".metadata").string();
  try {
    ckpt::file_source src(path);
    ckpt::dcp::metadata md = ckpt::dcp::decode_metadata(src, options);
    // A rank-local file (docs/formats.md §9.8) covers its tensors only with the other
    // ranks' files: alone, only its storage index can be checked.
    const bool rank_local = ckpt::dcp::rank_local_metadata_rank(std::filesystem::path(path).filename().string()).has_value();
    if (check && rank_local) ckpt::dcp::check_storage_index(md);
    else if (check) ckpt::dcp::check_metadata(md);
    if (!quiet) std::cout << to_json(md).dump(1) << "\n";
    return 0;
  } catch (ckpt::error& e) {
    e.with_file(path);
    std::cerr << e.one_line() << "\n";
    return ckpt::exit_code(e.kind());
  }
}
