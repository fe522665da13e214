// 2^x on 16 float lanes with AVX-512F: a floor reduction and exp2.hpp's AVX-512 fit (d1 … d6;
// the algorithm and error there). Internal linkage (anonymous namespace): each AVX-512
// translation unit gets its own copy, so the linker never shares it with portable or AVX2
// code. Include only from *_avx512.cpp files.
#pragma once

#include <immintrin.h>

#include "exp2.hpp"

namespace attn::detail {
namespace {

// Four kinds of op, none an integer one: g = x − floor(x) in one vreduceps (exact), the
// polynomial, then p · 2^floor(x) by vscalefps, which floors x itself — so neither n = x − g
// nor an upper clamp (x ≥ 128 overflows to inf in vscalefps; the clamp guarded exp2.hpp's
// integer exponent add). 9 vector ops; the round-to-nearest form before (exp2.hpp's first
// fit) took 11: a min, vreduceps, a subtract for n, the polynomial, the mask (kernels-lab fwd-19).
// Special values: −inf → 0 (the mask), +inf → inf (vscalefps by 2^+inf),
// NaN → NaN (vreduceps and vscalefps pass it on; the compare is unordered-true).
inline __m512 exp2_ps512(__m512 x) {
    using namespace exp2poly;
    const __m512 g = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(d6), g, _mm512_set1_ps(d5));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(d4));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(d3));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(d2));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(d1));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(1.0f));
    // Below kMin exactly 0, as every row (exp2.hpp): a result there would be subnormal.
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kMin), _CMP_NLT_UQ), p, x);
}

}  // namespace
}  // namespace attn::detail
