// Internal: `ckptool rekey` of a torch.export archive (formats.md §14.8). Every place the
// archive names a parameter, buffer, constant or module is renamed together: the keys of
// both payload configs, the signature's targets, module_call_graph and nn_module_stack paths;
// the tensor files and every other record are copied byte for byte.
#pragma once

#include "ckpt/checkpoint.h"
#include "ckpt/rekey_file.h"

namespace ckpt::detail {

/// Plans the renaming over `c` (a pt2 checkpoint) into result.plan (the weights configs'
/// keys, as the checkpoint names them) and, unless req.dry_run, writes the archive into
/// req.output and reads it back. Throws ckpt::error: check_failed for collisions or an
/// emptied name; unsupported where a name cannot be renamed exactly (AOTInductor models,
/// records it does not know, a module path whose names would not move together); io when
/// the written archive does not read back as planned. Nothing is written before the plan
/// and every rewritten record are complete.
void rekey_pt2(checkpoint& c, const rekey_request& req, rekey_result& result);

}  // namespace ckpt::detail
