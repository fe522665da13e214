// float16 / bfloat16 → float32 with AVX2 + F16C: the one set of 16-bit loaders of the AVX2
// kernels (decode_avx2.cpp reads K/V rows with them, flash_avx2.cpp converts Q/K/V tiles).
// float16: vcvtph2ps (exact; inf/NaN/subnormals kept). bfloat16: the top half of a float32,
// so a 16-bit shift (exact). Internal linkage (anonymous namespace), like exp2_avx2.hpp:
// include only from *_avx2.cpp files.
#pragma once

#include <immintrin.h>

#include <cstdint>

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

}  // namespace
}  // namespace attn::detail
