// The AVX-512 FMA ceiling: built with -mavx512f, called only after cpu_has_avx512() said yes
// (so a CPU without AVX-512 never executes an instruction from here).
#include <immintrin.h>

#include "peaks.hpp"

namespace attn::bench::detail {

// 12 independent chains acc = acc·m + c on 16-lane vectors: the AVX2 loop's shape
// (peaks_avx2.cpp says why 12 chains and these constants) at the width of the avx512 row.
float fma_chains_avx512(long iters) {
    const __m512 m = _mm512_set1_ps(0.999f);
    const __m512 c = _mm512_set1_ps(0.001f);
    __m512 a0 = _mm512_set1_ps(0.10f), a1 = _mm512_set1_ps(0.11f), a2 = _mm512_set1_ps(0.12f);
    __m512 a3 = _mm512_set1_ps(0.13f), a4 = _mm512_set1_ps(0.14f), a5 = _mm512_set1_ps(0.15f);
    __m512 a6 = _mm512_set1_ps(0.16f), a7 = _mm512_set1_ps(0.17f), a8 = _mm512_set1_ps(0.18f);
    __m512 a9 = _mm512_set1_ps(0.19f), a10 = _mm512_set1_ps(0.20f), a11 = _mm512_set1_ps(0.21f);
    for (long i = 0; i < iters; ++i) {
        a0 = _mm512_fmadd_ps(a0, m, c);
        a1 = _mm512_fmadd_ps(a1, m, c);
        a2 = _mm512_fmadd_ps(a2, m, c);
        a3 = _mm512_fmadd_ps(a3, m, c);
        a4 = _mm512_fmadd_ps(a4, m, c);
        a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c);
        a7 = _mm512_fmadd_ps(a7, m, c);
        a8 = _mm512_fmadd_ps(a8, m, c);
        a9 = _mm512_fmadd_ps(a9, m, c);
        a10 = _mm512_fmadd_ps(a10, m, c);
        a11 = _mm512_fmadd_ps(a11, m, c);
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
