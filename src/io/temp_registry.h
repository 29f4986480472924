// The temporary files in progress, for signal handlers (ckpt/output_set.h).
#pragma once

namespace ckpt::temp_registry {

/// Remembers `path` until release(); returns its slot, or -1 when every slot is taken
/// (then only the owner's destructor removes the file).
int hold(const char* path) noexcept;
/// Remembers a staging directory (ckpt/output_dir.h): a signal handler removes the files
/// directly in it, then the directory, after every held file. Released by release().
int hold_directory(const char* path) noexcept;
void release(int slot) noexcept;
/// A set begins renaming (its own slots released first): commit_started() turns true.
void mark_commit_started() noexcept;
/// Empties and removes a staging directory (async-signal-safe; also used outside handlers).
void remove_directory(const char* path) noexcept;

}  // namespace ckpt::temp_registry
