#include "formats/dcp_transforms.h"

#include <zstd.h>

#include <memory>

#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

// _extension.py ZStandard: registry name "stream.zstd", version "1"; the descriptor is
// "name/version" (ExtensionRegistry.from_descriptor_list partitions at '/').
constexpr const char* kZstd = "stream.zstd/1";

[[noreturn]] void fail(const byte_source& src, errc kind, const std::string& what, uint64_t at) {
  error e(kind, what, at);
  throw src.locate(e);
}

// A zstd stream of one or more frames, as zstandard's stream_writer writes it (no content
// size in the frame header, so the output grows as it is decoded). Offsets in errors are
// `src`'s, exact for the first transform of a chain.
std::vector<uint8_t> unzstd(const std::vector<uint8_t>& in, const byte_source& src, uint64_t max_bytes) {
  std::unique_ptr<ZSTD_DStream, size_t (*)(ZSTD_DStream*)> ds(ZSTD_createDStream(), ZSTD_freeDStream);
  if (!ds) fail(src, errc::limit, "cannot allocate a zstd decoder", 0);
  ZSTD_initDStream(ds.get());
  std::vector<uint8_t> out;
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  const size_t step = ZSTD_DStreamOutSize();
  size_t pending = 1;  // ZSTD_decompressStream's hint: 0 once a frame is complete
  while (input.pos < input.size || pending != 0) {
    const size_t had = out.size();
    const size_t before = input.pos;
    out.resize(had + step);
    ZSTD_outBuffer output{out.data() + had, step, 0};
    pending = ZSTD_decompressStream(ds.get(), &output, &input);
    out.resize(had + output.pos);
    if (ZSTD_isError(pending)) fail(src, errc::corrupt, std::string("zstd stream: ") + ZSTD_getErrorName(pending), input.pos);
    if (out.size() > max_bytes)
      fail(src, errc::limit, "a zstd-compressed item inflates past " + std::to_string(max_bytes) +
                                 " bytes (the zip record limit)", 0);
    if (pending != 0 && input.pos == input.size && input.pos == before && output.pos == 0)
      fail(src, errc::corrupt, "zstd stream ends inside a frame", in.size());
  }
  return out;
}

}  // namespace

bool known_dcp_transforms(const std::vector<std::string>& descriptors) {
  for (const auto& d : descriptors)
    if (d != kZstd) return false;
  return true;
}

std::vector<uint8_t> undo_dcp_transforms(const byte_source& src, const std::vector<std::string>& descriptors,
                                         uint64_t max_bytes) {
  for (const auto& d : descriptors)
    if (d != kZstd)
      fail(src, errc::unsupported, "stream transform '" + d + "' (this build undoes only " + kZstd + ")", 0);
  if (src.size() > max_bytes)
    fail(src, errc::limit, "an item of " + std::to_string(src.size()) + " bytes is over the zip record limit", 0);
  std::vector<uint8_t> bytes = src.read_vector(0, size_t(src.size()));
  // Each transform wraps the stream the next one reads; a chain of one is what PyTorch
  // writes, but the order is FileSystemReader's either way.
  for (size_t i = 0; i < descriptors.size(); ++i) bytes = unzstd(bytes, src, max_bytes);
  return bytes;
}

}  // namespace ckpt::detail
