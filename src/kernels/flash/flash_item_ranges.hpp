// How run_flash hands a wave's items to its threads (ItemRanges): each thread owns a contiguous
// range of the list and takes from its front; a thread whose range is empty takes one item at a time
// from the back of the range with the most items left. Why not `omp for schedule(dynamic, 1)`: that
// deals consecutive items — a head's query blocks — out in turn, so on 2 threads every head's K/V
// (S6's attention: 256 KiB) was read into both threads' L2 and each head had two cold first tasks
// (≈ 59 µs against ≈ 47 µs) where one thread has one: 4 % more work a call (docs/kernels-lab.md fwd-40).
// A plain static split ended 0.25 ms apart; taking from the back keeps the end within about an item.
// Which thread runs an item changes no result: each item is computed whole by one thread.
// A part of the flash forward driver (flash_schedule.hpp includes it), in each ISA file's namespace.
#pragma once

#include <cstdint>

#ifndef ATTN_FLASH_NS
#error "include flash_driver.hpp, not flash_item_ranges.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

// One thread's range [front, back) of item offsets, both in one 64-bit word (front in the high
// half) so that the owner's take and a thief's take are one compare-and-swap each. A line of its
// own: the owner writes it every item. (GCC's __atomic builtins, not std::atomic: flash_driver.hpp
// says why this code avoids out-of-line std templates.)
struct alignas(64) ItemRange {
    std::uint64_t word = 0;
};

struct ItemRanges {
    // Offsets fit 32 bits (run_flash uses the ranges only when a wave has fewer than 2^31 items).
    static constexpr std::int64_t kMaxItems = std::int64_t{1} << 31;

    ItemRange* r = nullptr;  // one per thread of the team
    std::int64_t first = 0;  // the wave's first item (offsets count from it)
    int team = 1;

    static std::uint64_t pack(std::int64_t front, std::int64_t back) {
        return static_cast<std::uint64_t>(front) << 32 | static_cast<std::uint64_t>(back);
    }
    static std::int64_t front_of(std::uint64_t w) { return static_cast<std::int64_t>(w >> 32); }
    static std::int64_t back_of(std::uint64_t w) { return static_cast<std::int64_t>(w & 0xffffffffu); }

    // Thread `tid`'s share of `items`: contiguous, sizes differing by at most one. Each thread sets
    // its own before the region's barrier.
    void set_own(int tid, std::int64_t items) const {
        const std::int64_t lo = items * tid / team, hi = items * (tid + 1) / team;
        __atomic_store_n(&r[tid].word, pack(lo, hi), __ATOMIC_RELAXED);
    }

    // The next item for thread `tid`, or -1 when every range is empty.
    std::int64_t take(int tid) const {
        std::uint64_t w = __atomic_load_n(&r[tid].word, __ATOMIC_RELAXED);
        while (front_of(w) < back_of(w)) {
            if (__atomic_compare_exchange_n(&r[tid].word, &w, pack(front_of(w) + 1, back_of(w)), true, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                return first + front_of(w);
        }
        for (;;) {  // own range empty: the back of the fullest range
            int victim = -1;
            std::int64_t most = 0;
            for (int v = 0; v < team; ++v) {
                const std::uint64_t x = __atomic_load_n(&r[v].word, __ATOMIC_RELAXED);
                if (back_of(x) - front_of(x) > most) {
                    most = back_of(x) - front_of(x);
                    victim = v;
                }
            }
            if (victim < 0) return -1;
            std::uint64_t x = __atomic_load_n(&r[victim].word, __ATOMIC_RELAXED);
            while (front_of(x) < back_of(x)) {
                if (__atomic_compare_exchange_n(&r[victim].word, &x, pack(front_of(x), back_of(x) - 1), true,
                                                __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                    return first + back_of(x) - 1;
            }
        }
    }

    // The item thread `tid` takes next from its own range, or -1 (empty: it will take from another's back).
    std::int64_t own_next(int tid) const {
        const std::uint64_t w = __atomic_load_n(&r[tid].word, __ATOMIC_RELAXED);
        return front_of(w) < back_of(w) ? first + front_of(w) : -1;
    }
};

}  // namespace attn::detail::ATTN_FLASH_NS
