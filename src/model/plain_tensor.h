#pragma once
// Whether a checkpoint's tensor is a plain tensor whose values are bytes in the file: the
// only kind that writers copying bytes (convert, filling a torch.export archive) can
// reproduce exactly. Everything else is refused by them, with the reason given here.
#include <optional>
#include <string>

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

// Why `t` is not such a tensor ("is quantized (qint8)", "is a meta tensor (no data)", ...),
// or nothing when it is.
std::optional<std::string> not_plain_reason(const checkpoint& c, const tensor_record& t);

}  // namespace ckpt::detail
