// The globals torch.load(weights_only=True) accepts, mirrored from
// torch/_weights_only_unpickler.py (_get_allowed_globals, _tensor_rebuild_functions) in
// PyTorch 2.10/2.11. A global outside this set is code that torch.load would refuse to
// run under weights_only, and that plain torch.load (weights_only=False) would run.
#include <algorithm>
#include <string>
#include <string_view>

#include "ckpt/checkpoint.h"

namespace ckpt {
namespace {

constexpr std::string_view kAllowed[] = {
    "collections.OrderedDict",
    "collections.Counter",
    "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout",
    "torch.Size",
    "torch.Tensor",
    "torch.device",
    "_codecs.encode",
    "builtins.bytearray",
    "builtins.set",
    "builtins.complex",
    "torch._tensor._rebuild_from_type_v2",
    "torch.storage.UntypedStorage",
    "torch.UntypedStorage",
    "torch.per_tensor_affine",
    "torch.per_tensor_symmetric",
    "torch.per_channel_affine",
    "torch.per_channel_symmetric",
    "torch.per_channel_affine_float_qparams",
    "torch.strided",
    "torch.sparse_coo",
    "torch.sparse_csr",
    "torch.sparse_csc",
    "torch.sparse_bsr",
    "torch.sparse_bsc",
    "torch._mkldnn",
    // Registered by torch itself (add_safe_globals) when the modules that define them are
    // imported: torch.nested (imported by `import torch`), torch._dynamo, and
    // torch.distributed.tensor / device_mesh, which torch.load's own error asks the user to
    // import to load DTensors. A jagged nested tensor or a DTensor file is what these name.
    "torch.nested._internal.nested_tensor.NestedTensor",
    "torch.nested._internal.nested_tensor._rebuild_njt",
    "torch._dynamo.decorators._DimRange",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta",
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.tensor.DTensor",
    "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types.Shard",
};

constexpr std::string_view kRebuilds[] = {
    "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_tensor",
    "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_device_tensor_from_numpy",
    "_rebuild_xla_tensor",
};

// torch.FloatTensor, torch.cuda.HalfTensor, ...: legacy tensor type objects, allow-listed
// by weights_only as `torch._tensor_classes`.
bool is_tensor_class(std::string_view module, std::string_view name) {
  if (module != "torch" && module != "torch.cuda") return false;
  static constexpr std::string_view kPrefixes[] = {"Float", "Double", "Half", "BFloat16", "Long", "Int",
                                                  "Short", "Char", "Byte", "Bool", "ComplexFloat",
                                                  "ComplexDouble"};
  for (auto p : kPrefixes)
    if (name.size() == p.size() + 6 && name.substr(0, p.size()) == p && name.substr(p.size()) == "Tensor")
      return true;
  return false;
}

}  // namespace

bool is_weights_only_safe_global(std::string_view module, std::string_view name) {
  // weights_only blocks these modules even when a user allow-lists them.
  if (module == "sys" || module == "os" || module == "posix" || module == "nt") return false;
  std::string full = std::string(module) + "." + std::string(name);
  if (std::find(std::begin(kAllowed), std::end(kAllowed), full) != std::end(kAllowed)) return true;
  if (module == "torch._utils" &&
      std::find(std::begin(kRebuilds), std::end(kRebuilds), name) != std::end(kRebuilds))
    return true;
  if (module == "torch") {
    if (dtype_from_name(name) && name.find('.') == std::string_view::npos) return true;  // dtypes
    if (dtype_from_legacy_storage(name)) return true;                                    // storages
    static constexpr std::string_view kExtraDtypes[] = {"uint1", "uint2", "uint3", "uint4", "uint5",
                                                        "uint6", "uint7", "int1", "int2", "int3",
                                                        "int4", "int5", "int6", "int7"};
    if (std::find(std::begin(kExtraDtypes), std::end(kExtraDtypes), name) != std::end(kExtraDtypes))
      return true;
  }
  return is_tensor_class(module, name);
}

}  // namespace ckpt
