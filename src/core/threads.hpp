// The entry points' side of include/attn/threads.hpp: each public call that computes opens a
// ComputeThreads scope, which sets OpenMP's thread count for the calling thread to
// attn::num_threads() and gives the caller's own count back afterwards. Kernels then use
// OpenMP's default (omp_get_max_threads(), `#pragma omp parallel`) and follow it.
#pragma once

#include <cstdint>

#include "float_env.hpp"

namespace attn::detail {

// How many work items a kernel aims for when it splits a few large ones (flash's and decode's
// key chunks, flash's query groups — which keep the bits —, the backward's chunks of key
// blocks): four per CPU this process may run on
// (split_cpu_count), and at least `floor`. The process's count, never the thread count or the
// calling thread's affinity: the split, and with it the order of a merge, does not change with
// attn::num_threads() or with which thread calls; it can differ between machines (or processes
// started with other CPU sets) with different CPU counts (docs/environment.md).
std::int64_t split_target(std::int64_t floor);

// The CPUs the process's main thread may run on when attn first asks (sched_getaffinity of the
// process id), fixed from then on.
int split_cpu_count();

class ComputeThreads {
public:
    ComputeThreads();
    ~ComputeThreads();
    ComputeThreads(const ComputeThreads&) = delete;
    ComputeThreads& operator=(const ComputeThreads&) = delete;

private:
    int previous_;
    IeeeSubnormals subnormals_;  // the calling thread computes with IEEE subnormals (float_env.hpp)
};

}  // namespace attn::detail
