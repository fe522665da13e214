// A parallel loop that hands out items as `schedule(dynamic, 1)` would, for loop bodies that may
// throw (they allocate, or call code that checks): an exception must not leave an OpenMP region
// — that is std::terminate — so each body's exception is caught, the remaining iterations are
// skipped, and the first one is rethrown on the calling thread after the region (FirstError, for
// regions that are not one loop). The caller's interrupt flag (interrupt.hpp) skips them too.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <exception>

#include "float_env.hpp"
#include "interrupt.hpp"

namespace attn::detail {

// The first exception thrown by the work of an OpenMP region, caught where it was thrown (an
// exception must not leave a region: that is std::terminate) and rethrown by the calling thread
// after the region; once one piece of work has failed, or the caller's interrupt flag is set,
// the rest is skipped. parallel_for_may_throw uses it; a region that is more than one loop
// (flash_backward.cpp: per-thread buffers, barriers) wraps each piece of its work in run().
// Constructed on the calling thread, before the region (it takes that thread's interrupt flag).
class FirstError {
public:
    // body(), unless some work has failed already or an interrupt was asked for; what it throws
    // is kept if it is the first.
    template <class Body>
    void run(Body&& body) noexcept {
        if (failed()) return;
        try {
            body();
        } catch (...) {
#pragma omp critical(attn_first_error)
            if (!error_) error_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
        }
    }
    bool failed() const noexcept { return failed_.load(std::memory_order_relaxed) || interrupt_.requested(); }
    // On the calling thread, after the region: the first exception, if any, else
    // attn::Interrupted if the flag was set (some work may have been skipped).
    void rethrow() const {
        if (error_) std::rethrow_exception(error_);
        interrupt_.throw_if_requested();
    }

private:
    std::exception_ptr error_;
    std::atomic<bool> failed_{false};
    const Interrupt interrupt_;
};

// The items on the first `threads` threads (thread numbers 0 to threads - 1), one at a time, as
// `schedule(dynamic, 1)` hands them out. The region starts OpenMP's whole team all the same: a
// smaller one would make libgomp end the pool's other threads, and the call's next region create
// them again, past attn's check (startable_threads.hpp). The others take no item.
template <class Body>
void parallel_for_may_throw(std::int64_t n, int threads, Body&& body) {
    FirstError error;
    std::atomic<std::int64_t> next{0};
#pragma omp parallel
    if (omp_get_thread_num() < threads || omp_get_thread_num() == 0) {
        const IeeeSubnormals ieee;  // float_env.hpp
        for (std::int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) error.run([&] { body(i); });
    }
    error.rethrow();
}

// The threads a parallel_for_may_throw over n items will compute on: OpenMP's default count
// (attn's setting inside a ComputeThreads scope), at most n, and 1 where a region may not nest.
// For loops that size one workspace per thread before they start (omp_get_thread_num() indexes it).
inline int team_size(std::int64_t n) {
    if (omp_get_active_level() >= omp_get_max_active_levels()) return 1;
    const std::int64_t t = omp_get_max_threads();
    return static_cast<int>(n < t ? (n > 0 ? n : 1) : t);
}

// The same on OpenMP's default thread count (attn's setting inside a ComputeThreads scope).
template <class Body>
void parallel_for_may_throw(std::int64_t n, Body&& body) {
    parallel_for_may_throw(n, omp_get_max_threads(), static_cast<Body&&>(body));
}

}  // namespace attn::detail
