// How the flash backward reads its operands: operands.hpp.
#include "operands.hpp"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>  // baseline x86-64 (no ISA flag): transpose_rows' 4 × 4 blocks, stream_rows
#endif

#include "attn/half.hpp"
#include "../finite.hpp"
#include "../simd/convert.hpp"

namespace attn::detail {
namespace {

// A bf16 word as its pair half: NaN quietened as float_to_bf16 of its widened value would
// (q16), or NaN/±inf → 0 (q16z, the zeroed copies).
inline std::uint32_t q16(std::uint16_t u) { return (u & 0x7fffu) > kBF16Exponent ? (u | 0x40u) : u; }
inline std::uint32_t q16z(std::uint16_t u) { return (u & kBF16Exponent) == kBF16Exponent ? 0u : u; }

}  // namespace

bool direct_rows(const TensorView& t, int Dp, Rows& r) {
    if (!(t.dtype() == DType::f32 && t.stride(3) == 1 && t.dim(3) == Dp)) return false;
    r.base = t.data_as<const float>();
    r.sb = t.stride(0);
    r.sh = t.stride(1);
    r.si = t.stride(2);
    return true;
}

void finite_rows(const float* src, std::ptrdiff_t ld, std::int64_t L, int Dp, float* dst) {
    for (std::int64_t i = 0; i < L; ++i)
        for (int d = 0; d < Dp; ++d) dst[i * Dp + d] = nonfinite_f32(src[i * ld + d]) ? 0.0f : src[i * ld + d];
}

void widen_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t L, int Dp, float* dst) {
    const std::int64_t D = t.dim(3);
    for (std::int64_t i = 0; i < L; ++i) widen_row(t, t.offset(b, h, i, 0), t.stride(3), D, dst + i * Dp);
}

void transpose_rows(const float* src, std::ptrdiff_t ld, int n, std::int64_t D, float* dst, std::ptrdiff_t ldd) {
    int j = 0;
#if defined(__SSE2__)
    // 4 keys × 4 columns at a time: four row loads, the 4 × 4 shuffle, four column stores.
    for (; j + 4 <= n; j += 4) {
        const float* s = src + j * ld;
        std::int64_t d = 0;
        for (; d + 4 <= D; d += 4) {
            __m128 r0 = _mm_loadu_ps(s + d), r1 = _mm_loadu_ps(s + ld + d);
            __m128 r2 = _mm_loadu_ps(s + 2 * ld + d), r3 = _mm_loadu_ps(s + 3 * ld + d);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            _mm_storeu_ps(dst + d * ldd + j, r0);
            _mm_storeu_ps(dst + (d + 1) * ldd + j, r1);
            _mm_storeu_ps(dst + (d + 2) * ldd + j, r2);
            _mm_storeu_ps(dst + (d + 3) * ldd + j, r3);
        }
        for (; d < D; ++d)
            for (int jj = j; jj < j + 4; ++jj) dst[d * ldd + jj] = src[jj * ld + d];
    }
#endif
    for (; j < n; ++j)
        for (std::int64_t d = 0; d < D; ++d) dst[d * ldd + j] = src[j * ld + d];
}

bool stream_rows(float* dst, std::ptrdiff_t ld_dst, const float* src, std::ptrdiff_t ld_src, int n, std::int64_t cols,
                 float f) {
#if defined(__SSE2__)
    if (reinterpret_cast<std::uintptr_t>(dst) % 64 != 0 || ld_dst % 16 != 0 || cols % 16 != 0) return false;
    const __m128 scale = _mm_set1_ps(f);
    for (int j = 0; j < n; ++j) {
        float* o = dst + j * ld_dst;
        const float* s = src + j * ld_src;
        for (std::int64_t d = 0; d < cols; d += 4) _mm_stream_ps(o + d, _mm_mul_ps(_mm_loadu_ps(s + d), scale));
    }
    return true;
#else
    (void)dst, (void)ld_dst, (void)src, (void)ld_src, (void)n, (void)cols, (void)f;
    return false;
#endif
}

void end_streams() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

const float* f32_row(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i, float* w) {
    if (t.dtype() == DType::f32 && t.stride(3) == 1) return t.data_as<const float>() + t.offset(b, h, i, 0);
    widen_row(t, t.offset(b, h, i, 0), t.stride(3), t.dim(3), w);
    return w;
}

void bf16_rows(const float* src, std::ptrdiff_t ld, std::int64_t n, int cols, std::uint16_t* dst, std::ptrdiff_t ld_dst) {
    for (std::int64_t i = 0; i < n; ++i)
        for (int c = 0; c < cols; ++c) dst[i * ld_dst + c] = float_to_bf16(src[i * ld + c]);
}
void bf16_pairs(const float* src, std::ptrdiff_t ld, std::int64_t n, int cols, std::uint32_t* dst, std::ptrdiff_t ld_dst) {
    for (std::int64_t r = 0; r < n; r += 2)
        for (int c = 0; c < cols; ++c) {
            const std::uint32_t lo = float_to_bf16(src[r * ld + c]);
            const std::uint32_t hi = r + 1 < n ? float_to_bf16(src[(r + 1) * ld + c]) : 0u;
            dst[r / 2 * ld_dst + c] = lo | hi << 16;
        }
}

bool bf16_rows_in_place(const TensorView& t, int Dp) {
    return t.dtype() == DType::bf16 && t.stride(3) == 1 && t.dim(3) == Dp && t.stride(2) % 2 == 0;
}
void bf16_pairs16(const std::uint16_t* src, std::ptrdiff_t ld, std::int64_t n, int cols, std::uint32_t* dst,
                  std::ptrdiff_t ld_dst) {
    for (std::int64_t r = 0; r < n; r += 2) {
        const std::uint16_t* a = src + r * ld;
        std::uint32_t* o = dst + r / 2 * ld_dst;
        if (r + 1 < n) {
            const std::uint16_t* b = a + ld;
            for (int c = 0; c < cols; ++c) o[c] = static_cast<std::uint32_t>(a[c]) | static_cast<std::uint32_t>(b[c]) << 16;
        } else {
            for (int c = 0; c < cols; ++c) o[c] = a[c];
        }
    }
}
void bf16_pairs_t16(const std::uint16_t* src, std::ptrdiff_t sj, std::ptrdiff_t sd, int n, int np, std::int64_t D,
                    std::uint32_t* dst, std::ptrdiff_t ld_dst) {
    const bool plain = sd == 1 && D % 2 == 0 && !any_nonfinite16(src, sj, n, D, kBF16Exponent);
    if (plain)  // finite unit-stride rows: their words are the pairs (q16 changes nothing)
        for (int j = 0; j < n; ++j)
            for (std::int64_t p = 0; p < D / 2; ++p) std::memcpy(dst + p * ld_dst + j, src + j * sj + 2 * p, 4);
    for (int j = 0; j < (plain ? 0 : n); ++j) {
        const std::uint16_t* x = src + j * sj;
        std::int64_t d = 0;
        for (; d + 1 < D; d += 2) dst[d / 2 * ld_dst + j] = q16(x[d * sd]) | q16(x[(d + 1) * sd]) << 16;
        if (d < D) dst[d / 2 * ld_dst + j] = q16(x[d * sd]);
    }
    for (std::int64_t p = 0; p < (D + 1) / 2; ++p)
        for (int j = n; j < np; ++j) dst[p * ld_dst + j] = 0u;
}
void bf16_pairs_z16(const std::uint16_t* src, std::ptrdiff_t sj, std::ptrdiff_t sd, int n, std::int64_t D, int Dp,
                    std::uint32_t* dst, std::ptrdiff_t ld_dst) {
    const bool plain = sd == 1 && !any_nonfinite16(src, sj, n, D, kBF16Exponent);  // then q16z changes nothing
    for (int r = 0; r < n; r += 2) {
        const std::uint16_t* a = src + r * sj;
        std::uint32_t* o = dst + r / 2 * ld_dst;
        if (plain) {
            bf16_pairs16(a, sj, r + 1 < n ? 2 : 1, static_cast<int>(D), o, 0);
        } else {
            for (std::int64_t d = 0; d < D; ++d)
                o[d] = q16z(a[d * sd]) | (r + 1 < n ? q16z(a[sj + d * sd]) << 16 : 0u);
        }
        for (std::int64_t d = D; d < Dp; ++d) o[d] = 0u;
    }
}

}  // namespace attn::detail
