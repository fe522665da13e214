// The entry points' side of include/attn/threads.hpp: each public call that computes opens a
// ComputeThreads scope, which sets OpenMP's thread count for the calling thread to
// attn::num_threads() and gives the caller's own count back afterwards. Kernels then use
// OpenMP's default (omp_get_max_threads(), `#pragma omp parallel`) and follow it.
#pragma once

#include <cstdint>

namespace attn::detail {

// How many work items a kernel aims for when it splits a few large ones (decode's key chunks,
// the backward's chunks of key blocks): four per CPU this process may run on
// (omp_get_num_procs), and at least `floor`. The machine's count, never the thread count: the
// split, and with it the order of a merge, does not change with attn::num_threads(); it can
// differ between machines with different CPU counts (docs/environment.md).
std::int64_t split_target(std::int64_t floor);

class ComputeThreads {
public:
    ComputeThreads();
    ~ComputeThreads();
    ComputeThreads(const ComputeThreads&) = delete;
    ComputeThreads& operator=(const ComputeThreads&) = delete;

private:
    int previous_;
};

}  // namespace attn::detail
