// Backward benchmark of attn::sdpa_backward on the shapes of bench-shapes.md, callable
// from `attn bench` (run_backward_bench) and from the standalone attn_backward_bench.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::bench {

struct BackwardShape {
    std::string id;  // "S1", "S3"
    std::int64_t B, Hq, Hkv, Lq, Lk, D;
    bool causal;
};

// The shapes this benchmark knows: S1 and S3 of bench-shapes.md.
std::vector<BackwardShape> backward_shapes();

struct BackwardResult {
    BackwardShape shape;
    double flops = 0;            // 2.5 × forward FLOPs (forward = 4·B·H·Lq·Lk·D, causal half)
    double attn_seconds = 0;     // median over runs
    double attn_gflops = 0;
    double attn_cpu_seconds = 0;  // median process CPU time of one backward (all threads)
    double attn_gflops_cpu = 0;   // flops / (CPU seconds / threads): the rate without preemption
    double torch_seconds = 0;     // torch autograd of the hand-written attention; 0 if unavailable
    double torch_cpu_seconds = 0;
    double torch_gflops = 0;
    double fma_peak_gflops = 0;      // AVX2 FMA peak measured in the same run, same thread count (best of 5)
    double fma_peak_gflops_cpu = 0;  // the same per CPU-second × threads (median of 5)
    int threads = 0;
    std::string kernel;
};

// Runs the backward `runs` times (after one warm-up) and returns medians. If `python`
// is not empty, times torch autograd via `python bench/torch_backward.py` in the same run.
// dropout_p > 0 times the backward with dropout (torch is then skipped).
BackwardResult run_backward_bench(const BackwardShape& shape, int runs, const std::string& python,
                                  const std::string& torch_script, double dropout_p = 0.0);

// AVX2 FMA peak of this machine, GFLOP/s, on the current OpenMP thread count (0 if the
// CPU lacks AVX2/FMA); optionally also the rate per CPU-second × threads.
double measure_fma_peak_gflops(double* per_cpu_second = nullptr);

}  // namespace attn::bench
