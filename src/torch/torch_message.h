// Internal: LibTorch's multi-line messages reduced to the one line the CLI prints.
#pragma once

#include <string>
#include <string_view>

namespace ckpt::detail {

/// The line of a LibTorch message that says what failed: for an interpreter traceback
/// ("The following operation failed ...") the first unindented "...Error: " line, else the
/// first line; bounded in length.
std::string condense_torch_message(std::string_view msg);

}  // namespace ckpt::detail
