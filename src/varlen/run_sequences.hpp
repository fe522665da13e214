// How the sequences of a packed batch that do not go to flash (decode, reference) share the
// cores (sdpa_varlen runs its flash sequences as one task list: flash.hpp flash_forward_batch).
// A long sequence already has enough tasks ((head, 64-query block) pairs) for every thread
// inside its kernel, so long ones run one after another, each with all threads. Short ones would leave threads idle (and pay a
// fork/join each), so they run side by side, one thread each: their kernels' own parallel
// regions are then nested and get one thread (OpenMP's default max-active-levels of 1).
// Either way a sequence's result does not depend on the thread count (docs/kernels.md, "Parallel
// split and scaling"), so the split changes only the speed.
#pragma once

#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attn/threads.hpp"
#include "../core/parallel_for.hpp"

namespace attn::detail {

// tasks(i): the parallel tasks sequence i offers its kernel; run(i) runs it.
template <class Tasks, class Run>
void run_sequences(std::size_t n, Tasks&& tasks, Run&& run) {
    const int threads = attn::num_threads();  // the one thread setting (attn/threads.hpp)
    std::vector<std::size_t> shorts, longs;
    for (std::size_t i = 0; i < n; ++i) (tasks(i) < 4 * std::int64_t{threads} ? shorts : longs).push_back(i);
    if (threads > 1 && shorts.size() > 1 && omp_get_max_active_levels() <= 1 && !omp_in_parallel()) {
        parallel_for_may_throw(static_cast<std::int64_t>(shorts.size()), threads,
                               [&](std::int64_t j) { run(shorts[static_cast<std::size_t>(j)]); });
    } else {
        longs.insert(longs.end(), shorts.begin(), shorts.end());
    }
    for (std::size_t i : longs) run(i);
}

}  // namespace attn::detail
