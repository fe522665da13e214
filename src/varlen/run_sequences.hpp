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
#include <utility>
#include <vector>

#include "attn/threads.hpp"
#include "../core/parallel_for.hpp"

namespace attn::detail {

// The split of the sequences: those run side by side (one thread each), then those run one after
// another (each with all threads). Made apart from the run, so that a caller can take its lists
// before it writes anything (sdpa_varlen's bookkeeping step).
struct SequenceOrder {
    std::vector<std::size_t> side_by_side;
    std::vector<std::size_t> in_turn;
};

// tasks(i): the parallel tasks sequence i offers its kernel.
template <class Tasks>
SequenceOrder order_sequences(std::size_t n, Tasks&& tasks) {
    const int threads = attn::num_threads();  // the one thread setting (attn/threads.hpp)
    SequenceOrder order;
    std::vector<std::size_t> shorts;
    for (std::size_t i = 0; i < n; ++i) (tasks(i) < 4 * std::int64_t{threads} ? shorts : order.in_turn).push_back(i);
    if (threads > 1 && shorts.size() > 1 && omp_get_max_active_levels() <= 1 && !omp_in_parallel()) {
        order.side_by_side = std::move(shorts);
    } else {
        order.in_turn.insert(order.in_turn.end(), shorts.begin(), shorts.end());
    }
    return order;
}

// run(i) runs sequence i, in `order`.
template <class Run>
void run_sequences(const SequenceOrder& order, Run&& run) {
    if (!order.side_by_side.empty()) {
        parallel_for_may_throw(static_cast<std::int64_t>(order.side_by_side.size()), attn::num_threads(),
                               [&](std::int64_t j) { run(order.side_by_side[static_cast<std::size_t>(j)]); });
    }
    for (std::size_t i : order.in_turn) run(i);
}

}  // namespace attn::detail
