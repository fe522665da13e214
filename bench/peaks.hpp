// The machine's ceilings, measured by the benchmark itself in the same run as the kernels:
// the fp32 FMA throughput (what a compute-bound kernel can reach) and the read bandwidth
// from memory (what a bandwidth-bound kernel such as a decode step can reach).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace attn::bench {

// One ceiling measured on `threads` threads: the best of `repeats` trials (a ceiling is
// the best the machine did; noise from other processes only lowers a trial).
struct Ceiling {
    bool measured = false;
    double value = 0.0;        // GFLOP/s or GB/s (1e9)
    double median = 0.0;       // median of the trials, to show the noise
    int threads = 0;
    int repeats = 0;
    std::vector<double> trials;  // every trial, in order
    // CPU time the trials got / (wall time x threads): below 1 when other processes shared
    // the CPUs. value / cpu_share of the best trial estimates the ceiling on an idle machine.
    std::vector<double> cpu_shares;  // per trial
    double per_cpu = 0.0;            // best over trials of rate / cpu_share
    std::string method;        // what was run, in words
    std::string note;          // why not measured, if so
};

// The ceiling over both measurements (e.g. before and after the kernels): the best trial of
// either, the median of all. On a shared machine one of the two may have run under load.
Ceiling merge(const Ceiling& a, const Ceiling& b, const std::string& what);

// True when this CPU (and the OS, for the YMM state) supports AVX2 and FMA.
bool cpu_has_avx2_fma();

// True when this CPU (and the OS, for the ZMM state) can run attn's avx512 kernel row
// (attn::detail::cpu_supports(Isa::avx512): AVX-512 F+VL+BW+DQ and AVX2+FMA+F16C).
bool cpu_has_avx512();

// True when the avx512 row can also use AVX-512 BF16 (vdpbf16ps; bf16 compute, isa.hpp).
bool cpu_has_avx512_bf16();

// True when bf16 compute can run on AMX tiles (AMX-BF16 with the OS's grant of the tile state).
bool cpu_has_amx_bf16();

// fp32 FMA peak: every thread runs independent FMA chains for about `seconds`, on 256-bit
// (avx2) or 512-bit (avx512) vectors — the widths of attn's avx2 and avx512 kernel rows.
// avx512_bf16: the same loop with vdpbf16ps (bf16 pairs into float32, 64 FLOP per
// instruction) — the ceiling of the flash forward's bf16 compute on vdpbf16ps; amx_bf16:
// tdpbf16ps on AMX tiles (16384 FLOP per instruction) — its ceiling on AMX.
enum class FmaWidth { avx2, avx512, avx512_bf16, amx_bf16 };
Ceiling measure_fma_peak(int threads, double seconds, int repeats, FmaWidth width = FmaWidth::avx2);

// Read bandwidth: `threads` threads sum disjoint parts of a `bytes` buffer, `repeats` passes.
Ceiling measure_read_bandwidth(int threads, std::size_t bytes, int repeats);

namespace detail {
// Kernels of the measurements; the AVX2 ones live in peaks_avx2.cpp (the only file built
// with -mavx2 -mfma) and run only after cpu_has_avx2_fma().
// 12 chains of 8-lane FMAs, `iters` times: 192·iters FLOP. Returns a value that depends on
// every chain so the loop cannot be removed.
float fma_chains_avx2(long iters);
// Independent chains of the 512-bit loops (chains_avx512.hpp). 24, not the AVX2 loop's 12:
// vdpbf16ps has a longer latency than an FMA, and on the Zen 5 VM 12 chains of it ran at 0.92 of
// the rate 16 or 24 reach (the FMA's instruction rate; docs/kernels-lab.md#fwd-46), which put
// the bf16 ceiling 8 % low; the FMA loop reads the same with 12 or 24. 24 accumulators and the
// step's two operands fit the 32 zmm registers.
inline constexpr int kChainsAvx512 = 24;
// kChainsAvx512 chains of 16-lane FMAs (peaks_avx512.cpp, -mavx512f): 768·iters FLOP.
float fma_chains_avx512(long iters);
// kChainsAvx512 chains of vdpbf16ps (peaks_avx512_bf16.cpp, -mavx512bf16): 1536·iters FLOP.
float dpbf16_chains_avx512(long iters);
// 6 chains of tdpbf16ps on independent C tiles (peaks_amx_bf16.cpp, -mamx-bf16): 6·16384·iters FLOP.
float tdpbf16_chains_amx(long iters);
// Sum of n floats (n a multiple of 64, p 32-byte aligned) with 8 independent accumulators.
float sum_floats_avx2(const float* p, std::size_t n);
float sum_floats_sse2(const float* p, std::size_t n);
}  // namespace detail

}  // namespace attn::bench
