// The AVX-512 BF16 ceiling (vdpbf16ps): built with -mavx512f -mavx512bf16, called only after
// cpu_has_avx512_bf16() said yes. The FMA loop's shape (peaks_avx512.cpp) with vdpbf16ps:
// each instruction is 16 lanes × 2 bf16 products + their sum into a float32 lane = 64 FLOP.
#include <immintrin.h>

#include "peaks.hpp"

namespace attn::bench::detail {

float dpbf16_chains_avx512(long iters) {
    // Pairs (1.0, 1.0) and (2^-7, 2^-7): every chain grows by 2^-6 per step, so the values
    // stay finite for any iteration count a trial uses, and depend on every step.
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    __m512 a0 = _mm512_set1_ps(0.10f), a1 = _mm512_set1_ps(0.11f), a2 = _mm512_set1_ps(0.12f);
    __m512 a3 = _mm512_set1_ps(0.13f), a4 = _mm512_set1_ps(0.14f), a5 = _mm512_set1_ps(0.15f);
    __m512 a6 = _mm512_set1_ps(0.16f), a7 = _mm512_set1_ps(0.17f), a8 = _mm512_set1_ps(0.18f);
    __m512 a9 = _mm512_set1_ps(0.19f), a10 = _mm512_set1_ps(0.20f), a11 = _mm512_set1_ps(0.21f);
    for (long i = 0; i < iters; ++i) {
        a0 = _mm512_dpbf16_ps(a0, x, y);
        a1 = _mm512_dpbf16_ps(a1, x, y);
        a2 = _mm512_dpbf16_ps(a2, x, y);
        a3 = _mm512_dpbf16_ps(a3, x, y);
        a4 = _mm512_dpbf16_ps(a4, x, y);
        a5 = _mm512_dpbf16_ps(a5, x, y);
        a6 = _mm512_dpbf16_ps(a6, x, y);
        a7 = _mm512_dpbf16_ps(a7, x, y);
        a8 = _mm512_dpbf16_ps(a8, x, y);
        a9 = _mm512_dpbf16_ps(a9, x, y);
        a10 = _mm512_dpbf16_ps(a10, x, y);
        a11 = _mm512_dpbf16_ps(a11, x, y);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, s);
    float t = 0.0f;
    for (float v : lanes) t += v;
    return t;
}

}  // namespace attn::bench::detail
