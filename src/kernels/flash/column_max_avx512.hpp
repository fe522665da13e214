// The online softmax's new running max for 16 query columns of a score tile, shared by the
// AVX-512 flash paths (float32 in flash_avx512.cpp, bf16 compute in flash_avx512_bf16.cpp).
// Include only from *_avx512*.cpp files (internal linkage, as simd/exp2_avx512.hpp).
#pragma once

#include <immintrin.h>

#include <limits>

namespace attn::detail {
namespace {

struct ColumnMax {
    __m512 max;  // max(m_old, max_j s[j][c..c+16)): the new m
    __m512 use;  // what the exponentials subtract: max, or 0 where max is −inf
};

// mx: the new running max, max(m_old, the block's column max), however that was found.
inline ColumnMax column_max_of(__m512 mx) {
    // A column with nothing visible yet keeps m = −inf; subtract 0 there so that
    // 2^(−inf − 0) = 0 instead of 2^(−inf + inf) = NaN (NaN compares unequal: kept).
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    return {mx, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mx, ninf, _CMP_NEQ_UQ), mx)};
}

// s: nk rows of ldS floats (keys × query columns), columns c..c+16; mold: the old running max.
// Returns max(mold, max_j s[j][c..c+16)).
inline __m512 block_max16(const float* s, int ldS, int nk, int c, __m512 mold) {
    __m512 x0 = mold, x1 = mold, x2 = mold, x3 = mold;  // four independent max chains (latency)
    int j = 0;
    for (; j + 4 <= nk; j += 4) {
        x0 = _mm512_max_ps(x0, _mm512_load_ps(s + (j + 0) * ldS + c));
        x1 = _mm512_max_ps(x1, _mm512_load_ps(s + (j + 1) * ldS + c));
        x2 = _mm512_max_ps(x2, _mm512_load_ps(s + (j + 2) * ldS + c));
        x3 = _mm512_max_ps(x3, _mm512_load_ps(s + (j + 3) * ldS + c));
    }
    for (; j < nk; ++j) x0 = _mm512_max_ps(x0, _mm512_load_ps(s + j * ldS + c));
    return _mm512_max_ps(_mm512_max_ps(x0, x1), _mm512_max_ps(x2, x3));
}
inline ColumnMax column_max16(const float* s, int ldS, int nk, int c, __m512 mold) {
    return column_max_of(block_max16(s, ldS, nk, c, mold));
}

// The lazy rescale (FlashAttention-4's): the running max moves only in a column whose block
// raised it by more than `above` (mx − mold > above); elsewhere it stays at mold, so that
// block's weights reach up to e^above instead of 1, and α = 1 exactly. A column's first visible
// block always moves it (mold = −inf: the difference is +inf); −inf stays −inf and a NaN block
// max keeps mold (the difference is NaN; that column's sum is NaN already).
inline __m512 lazy_max(__m512 mold, __m512 mx, __m512 above) {
    return _mm512_mask_mov_ps(mold, _mm512_cmp_ps_mask(_mm512_sub_ps(mx, mold), above, _CMP_GT_OQ), mx);
}

}  // namespace
}  // namespace attn::detail
