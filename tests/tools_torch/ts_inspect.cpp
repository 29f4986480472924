// Test helper: prints ckpt::inspect_torchscript / run_on_meta results as JSON, so the
// Python tests can compare them with what torch.jit.load reports.
//
//   ts_inspect FILE                                   -> torchscript_info
//   ts_inspect FILE --run METHOD [SHAPE:DTYPE ...]    -> outputs ("2x3:float32", ":int64" = 0-dim)
//   ts_inspect FILE --plain-load                      -> torch::jit::load(FILE, meta), for comparison
//
// Every mode adds "process": {rchar, max_rss_kb, max_rss_before_kb, wall_s} (rchar: the
// /proc/self/io delta over the operation; max_rss_before_kb: the peak before it started).
// Errors: {"error": kind, "message": one line}, exit code as the CLI's.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/byte_source.h"
#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/torchscript.h"
#include "torch/torchscript_module.h"
#include "ckpt/zip_reader.h"

using nlohmann::json;

namespace {

uint64_t rchar() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value)
    if (key == "rchar:") return value;
  return 0;
}

long max_rss_kb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

ckpt::input_spec parse_input(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) throw ckpt::error(ckpt::errc::usage, "input needs SHAPE:DTYPE: " + s);
  ckpt::input_spec spec;
  auto dt = ckpt::dtype_from_name(s.substr(colon + 1));
  if (!dt) throw ckpt::error(ckpt::errc::usage, "unknown dtype in " + s);
  spec.type = *dt;
  std::stringstream dims(s.substr(0, colon));
  std::string d;
  while (std::getline(dims, d, 'x'))
    if (!d.empty()) spec.shape.push_back(std::stoll(d));
  return spec;
}

json tensors(const std::vector<ckpt::ts_tensor>& v) {
  json out = json::array();
  for (const auto& t : v) out.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ts_inspect FILE [--run METHOD [SHAPE:DTYPE ...] | --plain-load]\n";
    return 2;
  }
  std::string path = argv[1];
  json out;
  try {
    uint64_t rchar_before = rchar();
    long rss_before = max_rss_kb();  // LibTorch's own libraries and static initialisation
    auto start = std::chrono::steady_clock::now();
    std::string mode = argc > 2 ? argv[2] : "";
    if (mode == "--plain-load") {
      auto m = torch::jit::load(path, c10::Device(c10::kMeta));
      out["parameters"] = m.named_parameters().size();
    } else {
      ckpt::file_source src(path);
      auto ar = ckpt::zip::archive::open(src);
      if (mode == "--run") {
        if (argc < 4) throw ckpt::error(ckpt::errc::usage, "--run needs a method name");
        std::vector<ckpt::input_spec> inputs;
        for (int i = 4; i < argc; ++i) inputs.push_back(parse_input(argv[i]));
        json outputs = json::array();
        for (const auto& o : ckpt::run_on_meta(path, *ar, argv[3], inputs)) {
          json j = {{"path", o.path}, {"is_tensor", o.is_tensor}, {"type", o.type}};
          if (o.is_tensor) {
            j["dtype"] = o.dtype;
            j["shape"] = o.shape;
          } else {
            j["value"] = o.value;
          }
          outputs.push_back(j);
        }
        out["outputs"] = outputs;
      } else if (mode.empty()) {
        auto info = ckpt::inspect_torchscript(path, *ar);
        out["type"] = info.type;
        out["training"] = info.training;
        out["parameters"] = tensors(info.parameters);
        out["buffers"] = tensors(info.buffers);
        json subs = json::array();
        for (const auto& s : info.submodules) subs.push_back({{"name", s.name}, {"type", s.type}});
        out["submodules"] = subs;
        json methods = json::array();
        for (const auto& m : info.methods) methods.push_back({{"name", m.name}, {"schema", m.schema}});
        out["methods"] = methods;
        json attrs = json::array();
        for (const auto& a : info.attributes)
          attrs.push_back({{"name", a.name}, {"type", a.type}, {"value", a.value}, {"constant", a.constant}});
        out["attributes"] = attrs;
        out["bytes_read"] = info.bytes_read;
        out["bytes_skipped"] = info.bytes_skipped;
        out["file_size"] = src.size();
      } else {
        throw ckpt::error(ckpt::errc::usage, "unknown mode " + mode);
      }
    }
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out["process"] = {{"rchar", rchar() - rchar_before},
                      {"max_rss_kb", max_rss_kb()},
                      {"max_rss_before_kb", rss_before},
                      {"wall_s", wall}};
  } catch (const ckpt::error& e) {
    std::cout << json{{"error", ckpt::errc_name(e.kind())}, {"message", e.one_line()}}.dump() << "\n";
    return ckpt::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::cout << json{{"error", "exception"}, {"message", e.what()}}.dump() << "\n";
    return 70;
  }
  std::cout << out.dump(1) << "\n";
  return 0;
}
