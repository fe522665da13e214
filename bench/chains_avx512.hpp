// The loop of the AVX-512 compute ceilings: 12 independent chains acc = step(acc) on 16-lane
// vectors, then one sum that depends on every chain (so the loop cannot be removed). The FMA
// ceiling (peaks_avx512.cpp) and the vdpbf16ps ceiling (peaks_avx512_bf16.cpp) differ only in
// the step; one loop keeps the two ceilings measured the same way (peaks_avx2.cpp says why 12
// chains). Include only from a file built with the AVX-512 flags: the code is AVX-512.
#pragma once

#include <immintrin.h>

namespace attn::bench::detail {

// step(__m512) -> __m512, one instruction of the ceiling's kind; inlined into the loop.
template <class Step>
float chains_avx512(long iters, Step step) {
    __m512 a0 = _mm512_set1_ps(0.10f), a1 = _mm512_set1_ps(0.11f), a2 = _mm512_set1_ps(0.12f);
    __m512 a3 = _mm512_set1_ps(0.13f), a4 = _mm512_set1_ps(0.14f), a5 = _mm512_set1_ps(0.15f);
    __m512 a6 = _mm512_set1_ps(0.16f), a7 = _mm512_set1_ps(0.17f), a8 = _mm512_set1_ps(0.18f);
    __m512 a9 = _mm512_set1_ps(0.19f), a10 = _mm512_set1_ps(0.20f), a11 = _mm512_set1_ps(0.21f);
    for (long i = 0; i < iters; ++i) {
        a0 = step(a0);
        a1 = step(a1);
        a2 = step(a2);
        a3 = step(a3);
        a4 = step(a4);
        a5 = step(a5);
        a6 = step(a6);
        a7 = step(a7);
        a8 = step(a8);
        a9 = step(a9);
        a10 = step(a10);
        a11 = step(a11);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, s);
    float t = 0.0f;
    for (float x : lanes) t += x;
    return t;
}

}  // namespace attn::bench::detail
