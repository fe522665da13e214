// The ISA-specific half of the machine ceilings: built with -mavx2 -mfma, called only after
// cpu_has_avx2_fma() said yes (so a CPU without AVX2 never executes an instruction from here).
#include <immintrin.h>

#include "peaks.hpp"

namespace attn::bench::detail {

// 12 independent chains acc = acc·m + c. An FMA has a latency of 4 cycles on Zen 3 and on
// recent Intel cores and two units issue one each per cycle, so at least 8 chains are in
// flight to keep both busy; 12 leaves margin and still fits the 16 YMM registers with m, c.
// m < 1 and c > 0 keep every value near c/(1−m): no overflow and no denormals (which would
// slow the loop on some cores).
float fma_chains_avx2(long iters) {
    const __m256 m = _mm256_set1_ps(0.999f);
    const __m256 c = _mm256_set1_ps(0.001f);
    __m256 a0 = _mm256_set1_ps(0.10f), a1 = _mm256_set1_ps(0.11f), a2 = _mm256_set1_ps(0.12f);
    __m256 a3 = _mm256_set1_ps(0.13f), a4 = _mm256_set1_ps(0.14f), a5 = _mm256_set1_ps(0.15f);
    __m256 a6 = _mm256_set1_ps(0.16f), a7 = _mm256_set1_ps(0.17f), a8 = _mm256_set1_ps(0.18f);
    __m256 a9 = _mm256_set1_ps(0.19f), a10 = _mm256_set1_ps(0.20f), a11 = _mm256_set1_ps(0.21f);
    for (long i = 0; i < iters; ++i) {
        a0 = _mm256_fmadd_ps(a0, m, c);
        a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c);
        a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c);
        a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c);
        a7 = _mm256_fmadd_ps(a7, m, c);
        a8 = _mm256_fmadd_ps(a8, m, c);
        a9 = _mm256_fmadd_ps(a9, m, c);
        a10 = _mm256_fmadd_ps(a10, m, c);
        a11 = _mm256_fmadd_ps(a11, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, s);
    float t = 0.0f;
    for (float x : lanes) t += x;
    return t;
}

// p: n floats, 32-byte aligned, n % 64 == 0. Eight accumulators so the adds' latency never
// limits the loads: the loop is bound by the memory system only.
float sum_floats_avx2(const float* p, std::size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    for (std::size_t i = 0; i < n; i += 64) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
        s4 = _mm256_add_ps(s4, _mm256_load_ps(p + i + 32));
        s5 = _mm256_add_ps(s5, _mm256_load_ps(p + i + 40));
        s6 = _mm256_add_ps(s6, _mm256_load_ps(p + i + 48));
        s7 = _mm256_add_ps(s7, _mm256_load_ps(p + i + 56));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)),
                             _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, s);
    float t = 0.0f;
    for (float x : lanes) t += x;
    return t;
}

}  // namespace attn::bench::detail
