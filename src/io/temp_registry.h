// The temporary files in progress, for signal handlers (ckpt/output_set.h).
#pragma once

namespace ckpt::temp_registry {

/// Remembers `path` until release(); returns its slot, or -1 when every slot is taken
/// (then only the owner's destructor removes the file).
int hold(const char* path) noexcept;
void release(int slot) noexcept;
/// A set begins renaming (its own slots released first): commit_started() turns true.
void mark_commit_started() noexcept;

}  // namespace ckpt::temp_registry
