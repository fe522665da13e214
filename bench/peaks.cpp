// Machine ceilings measured in the same run as the kernels (see peaks.hpp). Portable code
// here; the AVX2 loops are in peaks_avx2.cpp and run only when the CPU has AVX2 and FMA.
#include "peaks.hpp"

#include "machine.hpp"

#include "core/cpu_features.hpp"

#include <emmintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace attn::bench {
namespace {

volatile float g_sink = 0.0f;  // results of the loops land here so they cannot be removed

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs body(thread index, thread count) on `threads` threads between two barriers and
// returns the wall time between them (thread start-up is outside the timed part).
template <class Body>
double timed_parallel(int threads, int& got_threads, Body body) {
    double t0 = 0.0, t1 = 0.0;
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        const int tid = omp_get_thread_num(), n = omp_get_num_threads();
#pragma omp barrier
#pragma omp master
        t0 = omp_get_wtime();
        total += body(tid, n);
#pragma omp barrier
#pragma omp master
        {
            t1 = omp_get_wtime();
            got_threads = n;
        }
    }
    g_sink = g_sink + total;
    return t1 - t0;
}

// A ceiling's figures from its trials (measured ones, or two runs' merged): the best rate, the
// median, and the best rate per unit of CPU share — what a trial would have reached had it had
// its CPUs alone (getrusage counts in ticks of ~1–4 ms; 250 ms trials keep that error small).
void summarise_trials(Ceiling& c) {
    c.value = *std::max_element(c.trials.begin(), c.trials.end());
    c.median = median_of(c.trials);
    c.per_cpu = 0.0;
    for (std::size_t i = 0; i < c.trials.size() && i < c.cpu_shares.size(); ++i)
        if (c.cpu_shares[i] > 0.0) c.per_cpu = std::max(c.per_cpu, c.trials[i] / c.cpu_shares[i]);
}

}  // namespace

bool cpu_has_avx2_fma() {
    // cpu_features() checks the CPUID bits and that the OS saves the YMM registers (XGETBV),
    // and honours ATTN_CPU_HIDE like every kernel choice.
    const attn::detail::CpuFeatures& f = attn::detail::cpu_features();
    return f.avx2 && f.fma;
}

bool cpu_has_avx512() { return attn::detail::cpu_supports(attn::detail::Isa::avx512); }

bool cpu_has_avx512_bf16() { return attn::detail::cpu_features().has_avx512_bf16(); }

bool cpu_has_amx_bf16() { return attn::detail::cpu_features().has_amx_bf16(); }

Ceiling measure_fma_peak(int threads, double seconds, int repeats, FmaWidth width) {
    Ceiling c;
    c.threads = threads;
    c.repeats = repeats;
    const bool amx = width == FmaWidth::amx_bf16;
    const bool bf16 = width == FmaWidth::avx512_bf16;
    const bool wide = width == FmaWidth::avx512 || bf16 || amx;
    if (!wide && !cpu_has_avx2_fma()) {
        c.note = "not measured: this CPU (or OS) lacks AVX2+FMA, the ISA attn's fast kernels use";
        return c;
    }
    if (wide && !cpu_has_avx512()) {
        c.note = "not measured: this CPU (or OS) lacks " + attn::detail::missing_features(attn::detail::Isa::avx512);
        return c;
    }
    if (bf16 && !cpu_has_avx512_bf16()) {
        c.note = "not measured: this CPU lacks avx512_bf16";
        return c;
    }
    if (amx && !cpu_has_amx_bf16()) {
        c.note = "not measured: this CPU (or OS) lacks amx_bf16";
        return c;
    }
    float (*const chains)(long) = amx    ? detail::tdpbf16_chains_amx
                                  : bf16 ? detail::dpbf16_chains_avx512
                                  : wide ? detail::fma_chains_avx512
                                         : detail::fma_chains_avx2;
    // 12 chains x 8 lanes (AVX2) or kChainsAvx512 x 16 lanes, x (mul + add); vdpbf16ps: 2 products
    // + 2 adds per lane; AMX: 6 tdpbf16ps of 2·16·16·32 FLOP each
    const double kFlopPerIter = amx ? 6.0 * 2 * 16 * 16 * 32
                                    : (wide ? 16.0 * detail::kChainsAvx512 : 12.0 * 8.0) * (bf16 ? 4.0 : 2.0);
    // Calibrate on one thread: iterations per second of one chain set.
    long iters = 1L << 20;
    int got = 0;
    double t = 0.0;
    for (;;) {
        t = timed_parallel(1, got, [&](int, int) { return chains(iters); });
        if (t > 0.02 || iters > (1L << 34)) break;
        iters *= 4;
    }
    iters = std::max(1L << 16, static_cast<long>(static_cast<double>(iters) * seconds / t));
    for (int r = 0; r < repeats; ++r) {
        const double cpu0 = process_cpu_seconds();
        const double dt = timed_parallel(threads, got, [&](int, int) { return chains(iters); });
        c.trials.push_back(kFlopPerIter * static_cast<double>(iters) * got / dt / 1e9);
        c.cpu_shares.push_back(cpu_share(process_cpu_seconds() - cpu0, dt, got));
    }
    c.measured = true;
    summarise_trials(c);
    c.method = std::string(amx    ? "6 independent tdpbf16ps chains (C tiles) per thread (AMX-BF16, 16384 FLOP each), ~"
                           : bf16 ? std::to_string(detail::kChainsAvx512) +
                                        " independent 512-bit vdpbf16ps chains per thread (AVX-512 BF16, 64 FLOP each), ~"
                           : wide ? std::to_string(detail::kChainsAvx512) +
                                        " independent 512-bit FMA chains per thread (AVX-512, -mavx512f), ~"
                                  : "12 independent 256-bit FMA chains per thread (AVX2, -mavx2 -mfma), ~") +
               std::to_string(static_cast<int>(seconds * 1000)) + " ms per trial";
    if (got != threads) c.note = "OpenMP gave " + std::to_string(got) + " threads instead of " + std::to_string(threads);
    c.threads = got;
    return c;
}

Ceiling measure_read_bandwidth(int threads, std::size_t bytes, int repeats) {
    Ceiling c;
    c.threads = threads;
    c.repeats = repeats;
    constexpr std::size_t kHuge = 2u << 20;
    bytes = std::max(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        c.note = "not measured: could not map " + std::to_string(bytes >> 20) + " MiB";
        return c;
    }
    // Huge pages where the kernel allows them: fewer TLB misses, as a large K/V cache would get.
    madvise(mem, bytes, MADV_HUGEPAGE);
    float* p = static_cast<float*>(mem);
    const std::size_t n = bytes / sizeof(float);  // a multiple of 64 (bytes is a multiple of 2 MiB)
    const bool avx2 = cpu_has_avx2_fma();
    int got = 0;
    // Each thread's part: a multiple of 64 floats; first touch by the thread that will read it.
    auto part = [n](int tid, int nt, std::size_t& lo, std::size_t& len) {
        const std::size_t blocks = n / 64;
        const std::size_t b0 = blocks * static_cast<std::size_t>(tid) / static_cast<std::size_t>(nt);
        const std::size_t b1 = blocks * static_cast<std::size_t>(tid + 1) / static_cast<std::size_t>(nt);
        lo = b0 * 64;
        len = (b1 - b0) * 64;
    };
    timed_parallel(threads, got, [&](int tid, int nt) {
        std::size_t lo, len;
        part(tid, nt, lo, len);
        std::fill(p + lo, p + lo + len, 0.5f);
        return 0.0f;
    });
    for (int r = 0; r < repeats; ++r) {
        const double cpu0 = process_cpu_seconds();
        const double dt = timed_parallel(threads, got, [&](int tid, int nt) {
            std::size_t lo, len;
            part(tid, nt, lo, len);
            return avx2 ? detail::sum_floats_avx2(p + lo, len) : detail::sum_floats_sse2(p + lo, len);
        });
        c.trials.push_back(static_cast<double>(bytes) / dt / 1e9);
        c.cpu_shares.push_back(cpu_share(process_cpu_seconds() - cpu0, dt, got));
    }
    munmap(mem, bytes);
    c.measured = true;
    summarise_trials(c);
    c.method = std::string("sum of a ") + std::to_string(bytes >> 20) + " MiB buffer (" + (avx2 ? "AVX2" : "SSE2") +
               " loads, 8 accumulators, huge pages advised), one pass per trial";
    if (got != threads) c.note = "OpenMP gave " + std::to_string(got) + " threads instead of " + std::to_string(threads);
    c.threads = got;
    return c;
}

Ceiling merge(const Ceiling& a, const Ceiling& b, const std::string& what) {
    if (!a.measured) return b.measured ? b : a;
    if (!b.measured) return a;
    Ceiling c = a;
    c.trials.insert(c.trials.end(), b.trials.begin(), b.trials.end());
    c.cpu_shares.insert(c.cpu_shares.end(), b.cpu_shares.begin(), b.cpu_shares.end());
    summarise_trials(c);
    c.repeats = a.repeats + b.repeats;
    c.method = a.method + "; " + what;
    if (c.note.empty()) c.note = b.note;
    return c;
}

namespace detail {

// The x86-64 baseline version of sum_floats_avx2, for CPUs without AVX2.
float sum_floats_sse2(const float* p, std::size_t n) {
    __m128 s[8];
    for (auto& x : s) x = _mm_setzero_ps();
    for (std::size_t i = 0; i < n; i += 32)
        for (int j = 0; j < 8; ++j) s[j] = _mm_add_ps(s[j], _mm_load_ps(p + i + 4 * j));
    for (int j = 1; j < 8; ++j) s[0] = _mm_add_ps(s[0], s[j]);
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, s[0]);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace detail
}  // namespace attn::bench
