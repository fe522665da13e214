// Decode benchmark (bench-shapes.md S5 and S7) with the machine's read bandwidth measured
// in the same run. A function, so the project's `attn bench` can call it; the
// attn-decode-bench program prints it.
#pragma once

#include <string>
#include <vector>

#include "attn/dtype.hpp"

namespace attn::bench {

struct DecodeTiming {
    std::string shape;           // "S5" or "S7"
    DType storage = DType::f32;  // cache storage
    long long B = 0, Hq = 0, Hkv = 0, Lk = 0, D = 0;
    double bytes = 0;            // K + V bytes one step must read
    double median_ms = 0, min_ms = 0;
    // Cold runs only: each step's GB/s over the read bandwidth of the eviction stream that
    // ran just before it (the same 2 threads, the same moment): robust to a shared machine.
    double median_bw_fraction = 0;
    double gbps() const { return bytes / (median_ms * 1e-3) / 1e9; }
    double flops() const { return 4.0 * B * Hq * Lk * D; }  // Lq = 1: QKᵀ and AV
    double gflops() const { return flops() / (median_ms * 1e-3) / 1e9; }
};

struct DecodeBenchReport {
    double read_gbps = 0;        // streaming read bandwidth, same threads, median
    double fma_gflops = 0;       // AVX2 FMA peak on the same threads, median (0 without AVX2)
    int threads = 0, runs = 0;
    std::string isa;             // decode path used: avx2 or portable
    bool cold = true;            // caches flushed before every timed step
    std::vector<DecodeTiming> timings;
    const DecodeTiming* find(const std::string& shape, DType storage) const;
    std::string text() const;    // a table plus the three target checks
};

// Streaming sum over `bytes` (>= 1 GiB advised), on the current OpenMP threads; median of
// `runs`, GB/s. The buffer is allocated and touched before timing.
double measure_read_bandwidth(std::size_t bytes, int runs);

// fp32 FMA throughput (8 independent 256-bit chains per thread) on the current OpenMP
// threads, wall time, median of `runs`, GFLOP/s; 0 when the CPU lacks AVX2+FMA.
double measure_fma_peak(int runs);

// S5 and S7 with float32 and float16 caches, `runs` timed steps each (median), caches
// allocated and filled (touched) before timing. cold = evict the CPU caches before each
// timed step by streaming a 1 GiB buffer (this CPU's L3 could otherwise hold a 64–256 MiB
// cache; a model's many layers would not stay there).
DecodeBenchReport run_decode_bench(int runs, bool cold);

}  // namespace attn::bench
