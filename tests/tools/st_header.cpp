// Test helper: validates a safetensors header with ckpt::safetensors::read_header and prints
// it as JSON (torch dtype names and torch shapes), or the error.
//   st_header FILE
// Exit status: 0, or the ckptool exit code of the error kind.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "ckpt/byte_source.h"
#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: st_header FILE\n");
    return 2;
  }
  nlohmann::json out;
  try {
    ckpt::file_source src(argv[1]);
    auto h = ckpt::safetensors::read_header(src);
    out["ok"] = true;
    out["header_size"] = h.header_size;
    out["data_start"] = h.data_start;
    out["bytes_read"] = src.bytes_read();
    auto& tensors = out["tensors"] = nlohmann::json::array();
    for (const auto& t : h.tensors)
      tensors.push_back({{"name", t.name},
                         {"dtype", ckpt::name(t.type)},
                         {"shape", t.shape},
                         {"begin", t.begin},
                         {"end", t.end},
                         {"file_offset", t.file_offset}});
    auto& meta = out["metadata"] = nlohmann::json::array();
    for (const auto& [k, v] : h.metadata) meta.push_back({k, v});
    std::cout << out.dump(1) << "\n";
    return 0;
  } catch (const ckpt::error& e) {
    out["ok"] = false;
    out["kind"] = ckpt::errc_name(e.kind());
    out["message"] = e.message();
    if (e.offset()) out["offset"] = *e.offset();
    std::cout << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return ckpt::exit_code(e.kind());
  }
}
