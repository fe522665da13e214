// float16 / bfloat16 ↔ float32 with AVX-512 (F+BW): the one set of 16-bit loaders of the
// AVX-512 kernels (decode_avx512.cpp, flash_avx512.cpp). float16: vcvtph2ps on 16 values;
// bfloat16: a 16-bit shift; a row's edge is a masked load. And the way back, narrow_row_avx512:
// attn/half.hpp's rounding bit for bit (the rule half_avx2.hpp's narrow_row_avx2 states).
// Scalars reuse the AVX2 helpers (F16C is part of the AVX-512 row's flags). Internal linkage:
// include only from *_avx512.cpp.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "half_avx2.hpp"

namespace attn::detail {
namespace {

// 16 values; lanes outside m read nothing and are 0.
inline __m512 f16x16_to_ps(const std::uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
inline __m512 bf16x16_to_ps(const std::uint16_t* p, __mmask16 m) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline __m512 f16x16_to_ps(const std::uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 bf16x16_to_ps(const std::uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// dst[i] = src[i·stride] for i < n, src float16 (is_f16) or bfloat16.
inline void widen_row_avx512(const std::uint16_t* src, std::int64_t stride, std::int64_t n, bool is_f16, float* dst) {
    if (stride != 1) {
        for (std::int64_t i = 0; i < n; ++i) dst[i] = is_f16 ? f16_to_ps1(src[i * stride]) : bf16_to_ps1(src[i * stride]);
        return;
    }
    std::int64_t i = 0;
    if (is_f16) {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, f16x16_to_ps(src + i));
    } else {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, bf16x16_to_ps(src + i));
    }
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, is_f16 ? f16x16_to_ps(src + i, m) : bf16x16_to_ps(src + i, m));
    }
}

// attn/half.hpp's float_to_bf16 on 16 lanes (half_avx2.hpp's bf16x8_bits, one zmm), narrowed
// to 16 words.
inline __m256i bf16x16_from_ps(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i top = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(top, _mm512_set1_epi32(0x40))));
}

// dst[i] = src[i] rounded to float16 (is_f16) or bfloat16, bit for bit attn/half.hpp (float16:
// vcvtps2ph, and a group holding a NaN redone by the scalar rule: narrow_row_avx2 says why).
inline void narrow_row_avx512(const float* src, std::int64_t n, bool is_f16, std::uint16_t* dst) {
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(src + i);
        __m256i* out = reinterpret_cast<__m256i*>(dst + i);
        if (!is_f16) {
            _mm256_storeu_si256(out, bf16x16_from_ps(x));
            continue;
        }
        _mm256_storeu_si256(out, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        if (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0)
            for (int k = 0; k < 16; ++k) dst[i + k] = float_to_f16(src[i + k]);
    }
    for (; i < n; ++i) dst[i] = is_f16 ? float_to_f16(src[i]) : float_to_bf16(src[i]);
}

}  // namespace
}  // namespace attn::detail
