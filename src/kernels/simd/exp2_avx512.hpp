// 2^x on 16 float lanes with AVX-512F: the same range reduction and polynomial as
// exp2_avx2.hpp (algorithm and error in exp2.hpp). Internal linkage (anonymous
// namespace): each AVX-512 translation unit gets its own copy, so the linker never shares
// it with portable or AVX2 code. Include only from *_avx512.cpp files.
#pragma once

#include <immintrin.h>

#include "exp2.hpp"

namespace attn::detail {
namespace {

// 2^x given xc = x clamped above to kMax (or x itself where x <= kMax is known).
inline __m512 exp2_clamped_ps512(__m512 x, __m512 xc) {
    using namespace exp2poly;
    // f = xc − round-to-nearest(xc) in one vreduceps, then n = xc − f: both exact, so f and n are
    // the bits that rounding to n (vrndscaleps) and subtracting gave — checked over all 2^32
    // inputs. One uop fewer on Intel cores, where vrndscaleps is 2 (the flash softmax alone +6–7 %
    // on Sapphire Rapids, kernels-lab fwd-17).
    const __m512 f = _mm512_reduce_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 n = _mm512_sub_ps(xc, f);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(c6), f, _mm512_set1_ps(c5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    // p · 2^n, exact (the same bits as exp2.hpp's exponent add: at n >= kMin every result is a
    // normal float or overflows to inf); below kMin (and −inf, whose f is NaN): exactly 0.
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kMin), _CMP_NLT_UQ), p, n);
}

inline __m512 exp2_ps512(__m512 x) {
    // min(const, x) returns x when x is NaN, so NaN propagates; +inf becomes kMax (2^128 = inf).
    // No lower clamp: vscalefps puts 2^n into the exponent without an integer add that could
    // wrap, and every lane below kMin is zeroed by the mask anyway.
    return exp2_clamped_ps512(x, _mm512_min_ps(_mm512_set1_ps(exp2poly::kMax), x));
}

// 2^x for x <= 0 or NaN — the online softmax's (s − max)·log2 e and (m_old − m_new)·log2 e, never
// positive — without the upper clamp, which returns such an x unchanged: the same bits as
// exp2_ps512, one vector op fewer (of ≈ 15 per 16 scores in the flash softmax).
inline __m512 exp2_nonpositive_ps512(__m512 x) { return exp2_clamped_ps512(x, x); }

}  // namespace
}  // namespace attn::detail
