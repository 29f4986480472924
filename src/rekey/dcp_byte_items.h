// BYTE_IO values of a DCP directory being rekeyed (docs/formats.md §9.7): `torch.save` blobs
// of any Python value, which rekey copies unopened and dcp.load unpickles as they are. One
// that holds a renamed key's name as a string would still name the old key after the copy.
#pragma once

#include <functional>
#include <string>

#include "ckpt/dcp.h"
#include "ckpt/dcp_rekey.h"
#include "ckpt/file_opener.h"

namespace ckpt::dcp {

/// Decodes (never runs) every BYTE_IO value of `md` not behind a stream transform, reached
/// through `in` by `rel(relative_path)`, and refuses (errc::unsupported, naming the data file
/// and byte) one holding a key `plan` renames, or a dotted tail of one that the edit changes
/// ("_orig_mod.0.weight" of "model._orig_mod.0.weight": an optimizer's param_groups name
/// parameters relative to the model). Fills result.unchecked_byte_items (values behind a
/// transform) and result.byte_item_globals (globals weights_only would refuse).
void check_byte_items(const file_opener& in, const std::function<std::string(const std::string&)>& rel,
                      const metadata& md, const rekey_plan& plan, const pickle::limits& lim,
                      dcp_rekey_result& result);

}  // namespace ckpt::dcp
