// Internal: a plan's rules with their globs compiled once. A plan is matched against every
// key of a checkpoint, and, while a DCP directory is opened, every chunk of it.
#pragma once

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "base/glob.h"
#include "ckpt/slice.h"

namespace ckpt::detail {

class selection_matcher {
 public:
  explicit selection_matcher(const slice_selection& sel);
  /// The placement of the first rule whose glob matches `key`; nullopt when none does.
  std::optional<placement> match(std::string_view key) const;

 private:
  std::vector<std::pair<text::glob, placement>> rules_;
};

}  // namespace ckpt::detail
