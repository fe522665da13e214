// The flag a call watches (attn/interrupt.hpp), as the parallel loops read it: taken once on the
// calling thread before a region (the scope is per thread, and OpenMP's other threads are not
// the caller's), then read by every thread of the region between tasks. FirstError
// (parallel_for.hpp) carries one; a region that is not FirstError's takes its own and throws
// after the region (an exception must not leave one).
#pragma once

#include <atomic>

#include "attn/interrupt.hpp"

namespace attn::detail {

class Interrupt {
public:
    // The calling thread's ScopedInterruptFlag's flag, or one never set: outside every scope,
    // and inside an active parallel region — a kernel nested in another's task (varlen's short
    // sequences) is stopped by the enclosing loop, and its own throw could leave the region.
    Interrupt() noexcept;
    // Sticky: once a reader has seen the flag set (and so skipped its work), the call stays
    // interrupted even if the flag is cleared before the region ends — another thread sharing the
    // flag may clear it for its own next call, and this call's skipped tasks or merges must not
    // then be returned as a result.
    bool requested() const noexcept {
        if (seen_.load(std::memory_order_relaxed)) return true;
        if (!flag_->load(std::memory_order_relaxed)) return false;
        seen_.store(true, std::memory_order_relaxed);
        return true;
    }
    // attn::Interrupted when some reader saw the flag set (work may have been skipped); on the
    // calling thread, after the region (whose end orders the readers' stores before this load).
    void throw_if_requested() const;
    // attn::Interrupted now if the flag is set: for work that reads it inside a task too (the
    // reference kernel, once per query row, as one head can take minutes); FirstError
    // (parallel_for.hpp) keeps the exception and rethrows it after the region.
    void stop_if_requested() const {
        if (requested()) throw_if_requested();
    }

private:
    const std::atomic<bool>* flag_;
    mutable std::atomic<bool> seen_{false};
};

// For its scope, the calls on this thread watch a flag nobody sets, whatever the caller's scope:
// ring attention's (ring.cpp, ring_backward.cpp), since a rank that stopped alone would leave its
// peers waiting in MPI.
class NotInterruptible {
public:
    NotInterruptible() noexcept;

private:
    ScopedInterruptFlag off_;
};

}  // namespace attn::detail
