// A fixed table of paths with an atomic state per slot: a signal handler can walk it at
// any moment without locks or allocation. Several outputs (and several sets, in a service)
// can be in progress at once.
#include "io/temp_registry.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "ckpt/output_set.h"

namespace ckpt {
namespace temp_registry {
namespace {

constexpr int kSlots = 64;
constexpr size_t kPathMax = 4096;
enum : int { kFree = 0, kFilling = 1, kHeld = 2 };

struct slot {
  std::atomic<int> state{kFree};
  bool directory = false;  // written before the state turns kHeld
  char path[kPathMax];
};

slot g_slots[kSlots];
std::atomic<bool> g_commit_started{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "a signal handler needs lock-free atomics");

int hold_slot(const char* path, bool directory) noexcept {
  size_t n = std::strlen(path);
  if (n >= kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(g_slots[i].path, path, n + 1);
    g_slots[i].directory = directory;
    g_slots[i].state.store(kHeld, std::memory_order_release);
    return i;
  }
  return -1;
}

}  // namespace

int hold(const char* path) noexcept { return hold_slot(path, false); }
int hold_directory(const char* path) noexcept { return hold_slot(path, true); }

void release(int slot) noexcept {
  if (slot >= 0 && slot < kSlots) g_slots[slot].state.store(kFree, std::memory_order_release);
}

void mark_commit_started() noexcept { g_commit_started.store(true); }

// Empties and removes a staging directory with system calls only (opendir allocates, which
// a signal handler may not). Its entries are plain files this process made there; anything
// unlinkat cannot remove (a subdirectory) stays, and so does the directory.
void remove_directory(const char* path) noexcept {
  int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    alignas(8) char buf[4096];
    for (int pass = 0; pass < 1000; ++pass) {
      long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      bool removed = false;
      for (long at = 0; at < n;) {
        // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
        unsigned short reclen;
        std::memcpy(&reclen, buf + at + 16, sizeof reclen);
        const char* name = buf + at + 19;
        at += reclen;
        if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
        if (::unlinkat(fd, name, 0) == 0) removed = true;
      }
      // Removing entries while listing can shift the listing: start over after a pass
      // that removed something.
      if (removed) ::lseek(fd, 0, SEEK_SET);
    }
    ::close(fd);
  }
  ::rmdir(path);
}

}  // namespace temp_registry

bool remove_temporaries_in_progress() noexcept {
  using namespace temp_registry;
  // Files first: a file in progress may lie in a staging directory.
  for (auto& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kHeld && !s.directory) ::unlink(s.path);
  for (auto& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kHeld && s.directory) remove_directory(s.path);
  return !g_commit_started.load();
}

bool commit_started() noexcept { return temp_registry::g_commit_started.load(); }

}  // namespace ckpt
