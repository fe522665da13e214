// 2^x on 8 float lanes with AVX2 + FMA: the algorithm and its error are in exp2.hpp.
// Internal linkage (anonymous namespace): each AVX2 translation unit gets its own copy,
// so the linker never shares it with portable code. Include only from *_avx2.cpp files.
#pragma once

#include <immintrin.h>

#include "exp2.hpp"

namespace attn::detail {
namespace {

inline __m256 exp2_ps(__m256 x) {
    using namespace exp2poly;
    // max/min(const, x) return x when x is NaN, so NaN propagates.
    const __m256 xc = _mm256_max_ps(_mm256_set1_ps(-127.0f), _mm256_min_ps(_mm256_set1_ps(kMax), x));
    const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(xc, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(c6), f, _mm256_set1_ps(c5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    const __m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    // Below −126 (and −inf): exactly 0.
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(kMin), _CMP_LT_OQ), r);
}

}  // namespace
}  // namespace attn::detail
