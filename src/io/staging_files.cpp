#include "staging_files.hpp"

#include <limits.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace attn::detail {
namespace {

// A fixed table, not a container: a signal handler may run while a slot is being filled or
// emptied, so nothing may allocate or move. 64 slots is ten times what the CLI ever has live
// (sdpa writes at most six outputs at once).
constexpr int kSlots = 64;
enum : int { kFree = 0, kFilling = 1, kLive = 2 };

struct Slot {
    std::atomic<int> state{kFree};
    char path[PATH_MAX];
};
Slot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads these atomics");

}  // namespace

int track_staging_file(const char* path) noexcept {
    const std::size_t n = std::strlen(path);
    if (n >= PATH_MAX) return -1;
    for (int i = 0; i < kSlots; ++i) {
        int expected = kFree;
        if (g_slots[i].state.compare_exchange_strong(expected, kFilling, std::memory_order_acquire)) {
            std::memcpy(g_slots[i].path, path, n + 1);
            g_slots[i].state.store(kLive, std::memory_order_release);
            return i;
        }
    }
    return -1;
}

void untrack_staging_file(int slot) noexcept {
    if (slot >= 0 && slot < kSlots) g_slots[slot].state.store(kFree, std::memory_order_release);
}

void remove_staging_files() noexcept {
    for (Slot& s : g_slots) {
        if (s.state.load(std::memory_order_acquire) == kLive) ::unlink(s.path);
    }
}

}  // namespace attn::detail
