// A fixed table of paths with an atomic state per slot: a signal handler can walk it at
// any moment without locks or allocation. Several outputs (and several sets, in a service)
// can be in progress at once.
#include "io/temp_registry.h"

#include <unistd.h>

#include <atomic>
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
  char path[kPathMax];
};

slot g_slots[kSlots];
std::atomic<bool> g_commit_started{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "a signal handler needs lock-free atomics");

}  // namespace

int hold(const char* path) noexcept {
  size_t n = std::strlen(path);
  if (n >= kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(g_slots[i].path, path, n + 1);
    g_slots[i].state.store(kHeld, std::memory_order_release);
    return i;
  }
  return -1;
}

void release(int slot) noexcept {
  if (slot >= 0 && slot < kSlots) g_slots[slot].state.store(kFree, std::memory_order_release);
}

void mark_commit_started() noexcept { g_commit_started.store(true); }

}  // namespace temp_registry

bool remove_temporaries_in_progress() noexcept {
  using namespace temp_registry;
  for (auto& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kHeld) ::unlink(s.path);
  return !g_commit_started.load();
}

bool commit_started() noexcept { return temp_registry::g_commit_started.load(); }

}  // namespace ckpt
