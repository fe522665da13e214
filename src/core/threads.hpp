// The entry points' side of include/attn/threads.hpp: each public call that computes opens a
// ComputeThreads scope, which sets OpenMP's thread count for the calling thread to
// attn::num_threads() and gives the caller's own count back afterwards. Kernels then use
// OpenMP's default (omp_get_max_threads(), `#pragma omp parallel`) and follow it.
#pragma once

namespace attn::detail {

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
