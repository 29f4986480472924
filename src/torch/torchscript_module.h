// The LibTorch half of ckpt/torchscript.h, for code that needs the module itself
// (materialize --model). Includes LibTorch headers: keep it out of the CLI's formatting code.
#pragma once

#include <cstdint>
#include <string>

#include <torch/script.h>

#include "ckpt/zip_reader.h"

namespace ckpt {

struct meta_load_stats {
  uint64_t bytes_read = 0;     // bytes LibTorch actually got from the file
  uint64_t bytes_skipped = 0;  // bytes it asked for inside data/ and constants/ records
};

/// The TorchScript module in `ar` (the index of `path`) with every parameter, buffer and
/// tensor constant on the meta device; the tensor records are never read. Throws
/// ckpt::error naming `path` (see inspect_torchscript); errc::unsafe, before LibTorch sees
/// the file, when the archive holds code LibTorch would run on load (ckpt/torchscript_code.h)
/// unless `allow_code`.
torch::jit::Module load_on_meta(const std::string& path, const zip::archive& ar,
                                meta_load_stats* stats = nullptr, bool allow_code = false);

}  // namespace ckpt
