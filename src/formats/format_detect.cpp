#include "formats/format_detect.h"

#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/safetensors.h"
#include "base/text.h"

namespace ckpt::detail {
namespace {

// pickle of the legacy MAGIC_NUMBER 0x1950a86a20f9469cfc6c as LONG1 (torch/serialization.py).
constexpr uint8_t kLegacyMagic[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
// The same below protocol 2 (torch.save(..., pickle_protocol=0 or 1), Python 2 or 3): a LONG
// text literal, and no PROTO opcode.
constexpr char kLegacyMagicText[] = "L119547037146038801333356L\n.";

bool starts_with(const uint8_t* p, size_t n, const char* magic, size_t m) {
  return n >= m && std::memcmp(p, magic, m) == 0;
}

// Protocol 0/1 pickles have no PROTO opcode and may start with almost any opcode.
bool starts_like_protocol0_pickle(const uint8_t* p, size_t n) {
  static const char kFirstOpcodes[] = "(cdilpgqtIFLSVNUX}])0GJKMTBC";
  return n > 0 && p[0] != 0 && std::strchr(kFirstOpcodes, p[0]) != nullptr;
}

bool looks_like_html(const uint8_t* p, size_t n) {
  size_t i = 0;
  if (n >= 3 && p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF) i = 3;  // a UTF-8 byte order mark
  while (i < n && std::isspace(p[i])) ++i;
  auto starts = [&](const char* word) {
    const size_t m = std::strlen(word);
    if (n - i < m) return false;
    for (size_t k = 0; k < m; ++k)
      if (std::tolower(p[i + k]) != word[k]) return false;
    return true;
  };
  return starts("<!doctype html") || starts("<html");
}

}  // namespace

sniffed sniff_format(const byte_source& src) {
  uint8_t head[512] = {};
  size_t n = size_t(std::min<uint64_t>(sizeof head, src.size()));
  src.read_exact(0, head, n);
  if (n == 0) throw error(errc::corrupt, "empty file: not a checkpoint", 0);

  if (starts_with(head, n, "PK\x03\x04", 4)) return sniffed::zip;
  if (n >= 2 && head[0] == 0x80 && head[1] <= 5 && n >= 2 + sizeof kLegacyMagic &&
      std::memcmp(head + 2, kLegacyMagic, sizeof kLegacyMagic) == 0)
    return sniffed::legacy_pickle;
  if (starts_with(head, n, kLegacyMagicText, sizeof kLegacyMagicText - 1)) return sniffed::legacy_pickle;
  // At protocol 4 and 5 the pickler opens a FRAME (opcode 0x95, an 8-byte length) first.
  if (n >= 11 + sizeof kLegacyMagic && head[0] == 0x80 && (head[1] == 4 || head[1] == 5) && head[2] == 0x95 &&
      std::memcmp(head + 11, kLegacyMagic, sizeof kLegacyMagic) == 0)
    return sniffed::legacy_pickle;
  if (safetensors::looks_like_safetensors(head, n, src.size())) return sniffed::safetensors;

  if (starts_with(head, n, "PYTORCH1", 8))
    throw error(errc::unsupported,
                "PyTorch 1.0-preview archive (PYTORCH1): unsupported, as in PyTorch itself; re-save it with a current PyTorch", 0);
  if (n > 262 && std::memcmp(head + 257, "ustar", 5) == 0)
    throw error(errc::unsupported,
                "tar archive: the PyTorch <= 0.3 legacy tar format is not supported; load it with an old PyTorch and re-save", 257);
  if (starts_with(head, n, "PK\x05\x06", 4))
    throw error(errc::corrupt, "empty zip archive: not a checkpoint", 0);
  if (starts_with(head, n, "7z\xbc\xaf\x27\x1c", 6))
    throw error(errc::unsupported,
                "7z archive, not a checkpoint (7z-wrapped torch files are a known malware carrier); unpack it and inspect the contents", 0);
  if (starts_with(head, n, "\x89PNG", 4))
    throw error(errc::unsupported, "PNG image, not a checkpoint", 0);
  if (starts_with(head, n, "\x1f\x8b", 2))
    throw error(errc::unsupported, "gzip stream, not a checkpoint; decompress it first", 0);
  if (starts_with(head, n, "GGUF", 4))
    throw error(errc::unsupported, "GGUF file (llama.cpp), not a PyTorch checkpoint", 0);
  if (starts_with(head, n, "\x93NUMPY", 6))
    throw error(errc::unsupported, "NumPy .npy array, not a PyTorch checkpoint", 0);
  // What a clone without git-lfs, or a download that hit an error page, leaves in place of
  // the weights: common enough to say so rather than "unrecognized".
  if (starts_with(head, n, "version https://git-lfs.github.com/spec/", 40))
    throw error(errc::unsupported,
                "a Git LFS pointer file, not the checkpoint it stands for: fetch the content (git lfs pull)", 0);
  if (looks_like_html(head, n))
    throw error(errc::unsupported, "an HTML page, not a checkpoint (a download that got an error or login page?)", 0);
  if (head[0] == 0x80 && n >= 2 && head[1] <= 5) return sniffed::bare_pickle;
  if (starts_like_protocol0_pickle(head, n)) return sniffed::maybe_pickle;
  throw_unrecognized(src);
}

void throw_unrecognized(const byte_source& src) {
  uint8_t head[8] = {};
  size_t n = size_t(std::min<uint64_t>(sizeof head, src.size()));
  src.read_exact(0, head, n);
  throw error(errc::unsupported, "unrecognized format (first bytes: " + text::hex_bytes(head, n) +
                                     "): not a torch.save, TorchScript or safetensors file", 0);
}

}  // namespace ckpt::detail
