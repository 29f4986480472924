// Test helper: writes a safetensors file through ckpt::safetensors::plan/write and the
// output policy (ckpt::output_set), so the tests can compare it byte for byte with
// safetensors.torch.save_file's.
//   safetensors_write json DESC OUT   tensors described in DESC (JSON), bytes from a blob:
//     {"data": BLOB, "metadata": {k: v} | null,
//      "tensors": [{"name": s | "name_hex": hex, "dtype": torch name, "shape": [...],
//                   "offset": o, "nbytes": n, "supply": n (default nbytes)}]}
//     "supply" makes the helper hand the writer that many bytes instead (a lying source).
//   safetensors_write copy IN OUT     the tensors and metadata of a safetensors file read by
//     ckptool's reader, given to the writer in reverse order (the writer must sort them).
// Prints {"ok": true, "file_size": n} or the error as {"ok": false, "kind", "message"};
// exit status 0 or the ckptool exit code of the error kind.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/output_set.h"
#include "ckpt/safetensors.h"
#include "formats/safetensors_writer.h"

namespace st = ckpt::safetensors;
using ordered = nlohmann::ordered_json;

namespace {

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

// Streams bytes [offset, offset + n) of `src` into the sink, 1 MiB at a time.
void copy_range(const ckpt::byte_source& src, uint64_t offset, uint64_t n, st::tensor_sink& sink) {
  std::vector<char> buf(std::min<uint64_t>(n, 1 << 20));
  while (n > 0) {
    const size_t k = size_t(std::min<uint64_t>(n, buf.size()));
    src.read_exact(offset, buf.data(), k);
    sink.write(buf.data(), k);
    offset += k;
    n -= k;
  }
}

int run(int argc, char** argv) {
  const std::string mode = argv[1], in = argv[2], out_path = argv[3];
  ckpt::output_set outputs;
  std::vector<st::tensor_spec> specs;
  std::optional<st::metadata_map> metadata;
  std::vector<uint64_t> offsets, supply;
  std::unique_ptr<ckpt::file_source> data;

  if (mode == "json") {
    std::ifstream f(in);
    const ordered desc = ordered::parse(f);
    outputs.add_input(in);
    const std::string blob = desc.at("data").get<std::string>();
    outputs.add_input(blob);
    data = std::make_unique<ckpt::file_source>(blob);
    if (desc.contains("metadata") && !desc["metadata"].is_null()) {
      metadata.emplace();
      for (const auto& [k, v] : desc["metadata"].items()) metadata->emplace_back(k, v.get<std::string>());
    }
    for (const auto& t : desc.at("tensors")) {
      st::tensor_spec s;
      s.name = t.contains("name_hex") ? from_hex(t["name_hex"].get<std::string>()) : t.at("name").get<std::string>();
      const auto type = ckpt::dtype_from_name(t.at("dtype").get<std::string>());
      if (!type) throw ckpt::error(ckpt::errc::usage, "unknown dtype " + t.at("dtype").get<std::string>());
      s.type = *type;
      s.shape = t.at("shape").get<std::vector<int64_t>>();
      s.nbytes = t.at("nbytes").get<uint64_t>();
      offsets.push_back(t.at("offset").get<uint64_t>());
      supply.push_back(t.value("supply", s.nbytes));
      specs.push_back(std::move(s));
    }
  } else if (mode == "copy") {
    outputs.add_input(in);
    data = std::make_unique<ckpt::file_source>(in);
    const st::header h = st::read_header(*data);
    if (!h.metadata.empty()) metadata = h.metadata;
    for (auto it = h.tensors.rbegin(); it != h.tensors.rend(); ++it) {
      specs.push_back({it->name, it->type, it->shape, it->end - it->begin});
      offsets.push_back(it->file_offset);
      supply.push_back(it->end - it->begin);
    }
  } else {
    throw ckpt::error(ckpt::errc::usage, "unknown mode " + mode);
  }

  // Everything is validated before the output exists.
  const st::file_layout layout = st::plan(specs, metadata);
  ckpt::output_file& out = outputs.add_output(out_path);
  outputs.open();
  st::write(out, layout, specs, [&](size_t i, st::tensor_sink& sink) { copy_range(*data, offsets[i], supply[i], sink); });
  outputs.commit();
  std::cout << nlohmann::json{{"ok", true}, {"file_size", layout.file_size()}}.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: safetensors_write json DESC OUT | copy IN OUT\n");
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const ckpt::error& e) {
    nlohmann::json j{{"ok", false}, {"kind", ckpt::errc_name(e.kind())}, {"message", e.one_line()}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return ckpt::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::cout << nlohmann::json{{"ok", false}, {"kind", "usage"}, {"message", e.what()}}.dump() << "\n";
    return 2;
  }
}
