// Test helper: opens a zip archive with ckpt::zip::archive and prints what it found as JSON.
//   zip_inspect [--verify] [--time N] FILE
// --verify reads every record and checks its CRC-32; --time N opens the archive N times and
// reports the fastest open. Exit status: 0 when the archive opened (and verified), else the
// ckptool exit code of the error kind.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/zip_reader.h"

int main(int argc, char** argv) {
  bool verify = false;
  int repeat = 0;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--verify")) verify = true;
    else if (!std::strcmp(argv[i], "--time") && i + 1 < argc) repeat = std::atoi(argv[++i]);
    else path = argv[i];
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: zip_inspect [--verify] [--time N] FILE\n");
    return 2;
  }
  nlohmann::json out;
  try {
    ckpt::file_source src(path);
    double best_ms = 0;
    for (int r = 0; r < repeat; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto a = ckpt::zip::archive::open(src);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0 || ms < best_ms) best_ms = ms;
    }
    uint64_t before = src.bytes_read();
    auto a = ckpt::zip::archive::open(src);
    out["ok"] = true;
    out["prefix"] = a->prefix();
    out["open_bytes_read"] = src.bytes_read() - before;
    if (repeat) out["open_ms"] = best_ms;
    auto& list = out["entries"] = nlohmann::json::array();
    for (const auto& e : a->entries()) {
      list.push_back({{"name", e.name},
                      {"record", e.record},
                      {"method", e.method},
                      {"flags", e.flags},
                      {"crc32", e.crc32},
                      {"compressed_size", e.compressed_size},
                      {"uncompressed_size", e.uncompressed_size},
                      {"local_header_offset", e.local_header_offset},
                      {"data_offset", e.data_offset},
                      {"end_offset", e.end_offset}});
      if (verify) {
        a->verify_crc(e);
        auto bytes = a->read_record(e);
        if (bytes.size() != e.uncompressed_size) throw ckpt::error(ckpt::errc::corrupt, "size mismatch");
      }
    }
    if (a->find("data.pkl") == nullptr && a->find("constants.pkl") == nullptr) out["torch"] = false;
    std::cout << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  } catch (const ckpt::error& e) {
    out["ok"] = false;
    out["kind"] = ckpt::errc_name(e.kind());
    out["message"] = e.message();
    if (e.offset()) out["offset"] = *e.offset();
    out["what"] = e.what();
    std::cout << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return ckpt::exit_code(e.kind());
  }
}
