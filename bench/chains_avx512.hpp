// The loop of the AVX-512 compute ceilings: kChainsAvx512 independent chains acc = step(acc) on
// 16-lane vectors, then one sum that depends on every chain (so the loop cannot be removed). The
// FMA ceiling (peaks_avx512.cpp) and the vdpbf16ps ceiling (peaks_avx512_bf16.cpp) differ only in
// the step; one loop keeps the two ceilings measured the same way. Include only from a file built
// with the AVX-512 flags: the code is AVX-512.
#pragma once

#include <immintrin.h>

#include "peaks.hpp"

namespace attn::bench::detail {

// step(__m512) -> __m512, one instruction of the ceiling's kind; inlined into the loop.
template <class Step>
float chains_avx512(long iters, Step step) {
    __m512 a[kChainsAvx512];
#pragma GCC unroll 32
    for (int c = 0; c < kChainsAvx512; ++c) a[c] = _mm512_set1_ps(0.10f + 0.01f * static_cast<float>(c));  // distinct: equal chains would be merged
    for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 32
        for (int c = 0; c < kChainsAvx512; ++c) a[c] = step(a[c]);
    }
    __m512 s = a[0];
#pragma GCC unroll 32
    for (int c = 1; c < kChainsAvx512; ++c) s = _mm512_add_ps(s, a[c]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, s);
    float t = 0.0f;
    for (float x : lanes) t += x;
    return t;
}

}  // namespace attn::bench::detail
