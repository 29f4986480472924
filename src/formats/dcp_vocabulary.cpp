// The globals a DCP `.metadata` may name (docs/formats.md §9.2): what PyTorch 2.4-2.11's
// FileSystemWriter pickles, and nothing that could run code when pickle.load imports it.
#include <algorithm>
#include <string>
#include <string_view>

#include "ckpt/dcp.h"

namespace ckpt::dcp {
namespace {

constexpr std::string_view kMetadataClasses[] = {
    "Metadata",          "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
    "TensorProperties",  "_MEM_FORMAT_ENCODING",  "MetadataIndex",        "StorageMeta",
};

// Constructors the pickle machine folds into plain data (ckpt/pickle.h): pickled by
// CPython for dicts, sets and bytes at low protocols, never run by us.
constexpr std::string_view kFolded[] = {
    "collections.OrderedDict", "builtins.set",  "builtins.frozenset", "builtins.bytes", "builtins.bytearray",
    "builtins.list",           "builtins.tuple", "builtins.dict",     "builtins.object", "_codecs.encode",
    "copyreg._reconstructor",  "copyreg.__newobj__", "__builtin__.set", "__builtin__.object",
};

// StorageMeta.checkpoint_id is the pathlib path the writer held; constructing one touches
// no file.
constexpr std::string_view kPaths[] = {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"};

template <size_t N>
bool in(const std::string_view (&list)[N], std::string_view s) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

}  // namespace

bool is_dcp_global(std::string_view module, std::string_view name) {
  if (module == "torch.distributed.checkpoint.metadata") return in(kMetadataClasses, name);
  if (module == "torch.distributed.checkpoint.filesystem") return name == "_StorageInfo";
  if (module == "torch.serialization") return name == "_get_layout";
  if (module == "pathlib" || module == "pathlib._local") return in(kPaths, name);
  if (module == "torch") {
    if (name == "Size") return true;
    // dtypes, pickled as bare globals: only names dtype_from_name knows, no dotted ones.
    return name.find('.') == std::string_view::npos && dtype_from_name(name).has_value();
  }
  std::string full = std::string(module) + "." + std::string(name);
  return in(kFolded, full);
}

}  // namespace ckpt::dcp
