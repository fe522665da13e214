// float16 / bfloat16 ↔ float32 with AVX2 + F16C: the one set of 16-bit loaders of the AVX2
// kernels (decode_avx2.cpp reads K/V rows with them, flash_avx2.cpp converts Q/K/V tiles).
// float16: vcvtph2ps (exact; inf/NaN/subnormals kept). bfloat16: the top half of a float32,
// so a 16-bit shift (exact). And the way back, narrow_row_avx2: attn/half.hpp's rounding
// (float_to_f16, float_to_bf16) bit for bit, 8 lanes at a time. Internal linkage (anonymous
// namespace), like exp2_avx2.hpp: include only from *_avx2.cpp files.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "attn/half.hpp"

namespace attn::detail {
namespace {

inline __m256 f16x8_to_ps(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 bf16x8_to_ps(const std::uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline float f16_to_ps1(std::uint16_t bits) { return _cvtsh_ss(bits); }
inline float bf16_to_ps1(std::uint16_t bits) {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

// dst[i] = src[i·stride] for i < n, src float16 (is_f16) or bfloat16.
inline void widen_row_avx2(const std::uint16_t* src, std::int64_t stride, std::int64_t n, bool is_f16, float* dst) {
    std::int64_t i = 0;
    if (stride == 1) {
        if (is_f16)
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, f16x8_to_ps(src + i));
        else
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, bf16x8_to_ps(src + i));
    }
    for (; i < n; ++i) dst[i] = is_f16 ? f16_to_ps1(src[i * stride]) : bf16_to_ps1(src[i * stride]);
}

// attn/half.hpp's float_to_bf16 on 8 lanes, as 32-bit lanes holding the 16-bit results: round
// to nearest even by adding 0x7fff + the kept LSB; a NaN keeps its top bits and is made quiet.
inline __m256i bf16x8_bits(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i top = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    // |x| as int32 is non-negative, so the signed compare is the unsigned one.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
}

// dst[i] = src[i] rounded to float16 (is_f16) or bfloat16 by attn/half.hpp's rule, bit for bit.
// float16: vcvtps2ph rounds to nearest even exactly as float_to_f16 does (overflow to inf,
// subnormal results); only a NaN's payload differs (F16C keeps its top bits, half.hpp makes
// every NaN sign | 0x7e00), so a group holding a NaN is redone by the scalar rule.
inline void narrow_row_avx2(const float* src, std::int64_t n, bool is_f16, std::uint16_t* dst) {
    std::int64_t i = 0;
    if (is_f16) {
        for (; i + 8 <= n; i += 8) {
            const __m256 x = _mm256_loadu_ps(src + i);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
            if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0)
                for (int k = 0; k < 8; ++k) dst[i + k] = float_to_f16(src[i + k]);
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            // packus works inside 128-bit halves: [a0..3 b0..3 a4..7 b4..7], then put the quarters in order.
            const __m256i w = _mm256_packus_epi32(bf16x8_bits(_mm256_loadu_ps(src + i)), bf16x8_bits(_mm256_loadu_ps(src + i + 8)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permute4x64_epi64(w, 0xd8));
        }
    }
    // The tail as a count: with n a constant 16 (the flash O store) GCC 12 otherwise warns that a
    // dead iteration of `for (; i < n; ++i)` overflows (-Waggressive-loop-optimizations).
    const std::int64_t rest = n - i;
    for (std::int64_t k = 0; k < rest; ++k) dst[i + k] = is_f16 ? float_to_f16(src[i + k]) : float_to_bf16(src[i + k]);
}

}  // namespace
}  // namespace attn::detail
