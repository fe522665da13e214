// The softcap's tanh in float32 (docs/conventions.md, "Score modifiers"), written once for
// every kernel: scores.hpp (flash forward, decode, the backward's rule callback) and the
// backward tile (tile_body.inl) include it. Internal linkage: each translation unit, ISA
// files included, compiles its own copy with its own vector width.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "exp2.hpp"  // not used here any more; kept for the files that got exp2poly through this one

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attn::detail {

// (2^f − 1)/f ≈ c1 + c2·f + … + c6·f⁵ on f in [−0.5, 0.5]: a relative-error minimax fit
// (iteratively reweighted least squares in double over 40001 points, rounded to float; fit
// error 1.1e-8). Not exp2.hpp's polynomial of 2^f: that one ends in "+ 1", and 2^f − 1 from
// it cancels for small f; this one gives 2^f − 1 with a small relative error down to f → 0.
namespace expm1poly {
inline constexpr float c1 = 6.931471825e-01f;
inline constexpr float c2 = 2.402264923e-01f;
inline constexpr float c3 = 5.550357327e-02f;
inline constexpr float c4 = 9.618237615e-03f;
inline constexpr float c5 = 1.339071547e-03f;
inline constexpr float c6 = 1.540347148e-04f;
}  // namespace expm1poly

namespace {

// tanh in float32 for the softcap, a vector at a time. With E = e^{2|x|} − 1 (no cancellation:
// see below)
//     tanh|x| = E / (E + 2)
// which is accurate at both ends: for small |x|, E ≈ 2|x| with a small relative error (so no
// separate small-|x| branch and no select); near 1 an error ε·E of E moves the quotient by only
// 2ε·E/(E + 2)², and the result is within about one ulp of 1. E from y = 2·log2 e·|x|
// (clamped at 64: E = 2^64 keeps E + 2 finite, and E/(E + 2) is 1 in float32 from |x| ≈ 9 on):
//     y = n + f, n = round(y) >= 0, f in [−0.5, 0.5]:   E = 2^n·(2^f − 1) + (2^n − 1)
// with 2^f − 1 = f·q(f) (expm1poly): for n = 0 that is f·q(f) itself, for n >= 1 the sum is at
// least 2·(2^-0.5 − 1) + 1 = 0.41, no cancellation either. The sign is copied from x; NaN stays
// NaN. Max error measured on a dense sweep (tests/kernels/test_modifiers.cpp): absolute 8.9e-8,
// relative 2.4e-7 (on every row's flash path 8.7e-8 and 2.4e-7).
//
// The width follows the translation unit's ISA: 16 lanes with AVX-512 (the flash_avx512 file:
// one zmm per op, half the instructions of two ymm — the softcap pass is compute-bound there),
// 8 where AVX is enabled, 4 (SSE2, the x86-64 baseline) elsewhere — so no 32-byte vector is
// ever passed without AVX, and no 64-byte one without AVX-512. Every lane computes the same.
// GCC/Clang vector extensions: a plain loop over a scalar tanh does not vectorise.
#if defined(__AVX512F__)
inline constexpr int kTanhLanes = 16;
#elif defined(__AVX__)
inline constexpr int kTanhLanes = 8;
#else
inline constexpr int kTanhLanes = 4;
#endif
typedef float vfloat __attribute__((vector_size(4 * kTanhLanes)));
typedef std::int32_t vint __attribute__((vector_size(4 * kTanhLanes)));

inline constexpr float kTanhTwoLog2e = 2.8853900817779268f;  // 2·log2 e: y = kTanhTwoLog2e·|x|

#if defined(__AVX512F__)
// AVX-512, in intrinsics so that every a·b + c is one FMA whatever GCC's contraction does (it
// fuses vector-extension expressions too, where the file has FMA: the avx2 copy below in the avx2
// files, not the portable one; docs/conventions.md, "Numerics and threads") and the range
// reduction is reduce/scalef:
// 18 instructions per 16 lanes. y = 2·log2 e·|x| (or NaN); the sign is taken from sign_of.
// always_inline: GCC kept it out of line (one call per vector), and a call clobbers every
// vector register — the flash micro-kernel's 16 accumulators were spilled around each call.
__attribute__((always_inline)) inline __m512 tanh_from_y512(__m512 y, __m512 sign_of) {
    using namespace expm1poly;
    const __m512 one = _mm512_set1_ps(1.0f);
    y = _mm512_min_ps(_mm512_set1_ps(64.0f), y);  // vminps returns its 2nd operand for NaN: kept
    // f = y − round-to-nearest(y) by one vreduceps, n = y − f: both exact, the bits of rounding to n
    // and subtracting, one uop fewer on Intel (as in exp2_avx512.hpp). The same results for every
    // y ≥ 0 or NaN — the only inputs, y = |a|·k with k > 0 — checked over all of them; y = −inf alone
    // would differ (−1 instead of NaN).
    const __m512 f = _mm512_reduce_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 n = _mm512_sub_ps(y, f);
    __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(c6), f, _mm512_set1_ps(c5));
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(c4));
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(c3));
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(c2));
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(c1));
    const __m512 two_n = _mm512_scalef_ps(one, n);  // 2^n, exact (0 <= n <= 64)
    const __m512 e = _mm512_fmadd_ps(two_n, _mm512_mul_ps(q, f), _mm512_sub_ps(two_n, one));
    const __m512 d = _mm512_add_ps(e, _mm512_set1_ps(2.0f));
    // e/d without a division (vdivps zmm is slower than these three): rcp14 (relative error
    // < 2^-14), q0 = e·rc, and one correction with the exact residual e − d·q0 (an FMA):
    // error ~2^-28 + the final rounding.
    const __m512 rc = _mm512_rcp14_ps(d);
    const __m512 q0 = _mm512_mul_ps(e, rc);
    const __m512 t = _mm512_fmadd_ps(rc, _mm512_fnmadd_ps(d, q0, e), q0);
    // t >= 0 (or NaN): t | (sign_of & sign bit), one vpternlogd (0xF8 = A | (B & C)).
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(t), _mm512_castps_si512(sign_of),
                                                         _mm512_set1_epi32(static_cast<int>(0x80000000u)), 0xF8));
}

// tanh(a·k/(2·log2 e)) for k > 0: the flash micro-kernel passes its accumulator and
// k = 2·log2 e·scale/c, one multiply for the scale, 1/c and 2·log2 e together.
__attribute__((always_inline)) inline __m512 tanh_scaled512(__m512 a, __m512 k) {
    return tanh_from_y512(_mm512_mul_ps(_mm512_abs_ps(a), k), a);
}

__attribute__((always_inline)) inline vfloat tanh_vec(vfloat x) {
    return tanh_scaled512(x, _mm512_set1_ps(kTanhTwoLog2e));
}
#else
// The same steps in vector extensions (AVX2: 8 lanes, baseline: 4): rounding by the 1.5·2^23
// trick, 2^n through the exponent field, and a true division.
__attribute__((always_inline)) inline vfloat tanh_vec(vfloat x) {
    using namespace expm1poly;
    vint xi;
    std::memcpy(&xi, &x, sizeof xi);
    const vint sign = xi & std::int32_t(0x80000000u);
    const vint axi = xi & 0x7fffffff;
    vfloat ax;
    std::memcpy(&ax, &axi, sizeof ax);
    vfloat y = ax * kTanhTwoLog2e;
    y = y < 64.0f ? y : vfloat{} + 64.0f;  // NaN → 64 here (float→int of NaN is undefined); restored below
    const vfloat n = (y + 12582912.0f) - 12582912.0f;  // round to nearest
    const vfloat f = y - n;
    vfloat q = f * c6 + c5;
    q = q * f + c4;
    q = q * f + c3;
    q = q * f + c2;
    q = q * f + c1;
    const vint bits = (__builtin_convertvector(n, vint) + 127) << 23;
    vfloat two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    const vfloat e = two_n * (q * f) + (two_n - 1.0f);
    vfloat t = e / (e + 2.0f);
    vint ti;
    std::memcpy(&ti, &t, sizeof ti);
    ti |= sign;
    std::memcpy(&t, &ti, sizeof t);
    return x == x ? t : x;
}
#endif

// The same function on one value (lane 0), for scalar callers and tests.
inline float tanh_f32(float x) {
    const vfloat v = vfloat{} + x;
    return tanh_vec(v)[0];
}

// s[j·stride] ← c·tanh(s[j·stride]·inv_c) for j < n, a vector at a time; with `grad` (stride 1)
// also grad[j] = 1 − tanh². (inv_c may carry another factor, e.g. the backward's scale.)
inline void softcap_f32(float* s, std::ptrdiff_t stride, std::int64_t n, float c, float inv_c, float* grad) {
    std::int64_t j0 = 0;
    if (stride == 1) {  // whole vectors straight from memory (the element loop below is scalar moves)
        for (; j0 + kTanhLanes <= n; j0 += kTanhLanes) {
            vfloat v;
            std::memcpy(&v, s + j0, sizeof v);
            const vfloat t = tanh_vec(v * inv_c);
            const vfloat out = t * c;
            std::memcpy(s + j0, &out, sizeof out);
            if (grad) {
                const vfloat g = 1.0f - t * t;
                std::memcpy(grad + j0, &g, sizeof g);
            }
        }
    }
    for (; j0 < n; j0 += kTanhLanes) {
        const int m = n - j0 < kTanhLanes ? static_cast<int>(n - j0) : kTanhLanes;
        vfloat v = {};
        for (int l = 0; l < m; ++l) v[l] = s[(j0 + l) * stride];
        const vfloat t = tanh_vec(v * inv_c);
        const vfloat out = t * c;
        for (int l = 0; l < m; ++l) s[(j0 + l) * stride] = out[l];
        if (grad) {
            const vfloat g = 1.0f - t * t;
            for (int l = 0; l < m; ++l) grad[j0 + l] = g[l];
        }
    }
}

// s[j] ← c·tanh(scale·s[j]·inv_c) for j < n (stride 1), grad as softcap_f32: the backward's
// scale and cap in one pass, scale·inv_c folded into one factor — unless that factor is not a
// normal float32 (it would turn 0·inf into NaN, or flush a score to 0): then scale first.
inline void scaled_softcap_f32(float* s, std::int64_t n, float scale, float c, float inv_c, float* grad) {
    const float k = scale * inv_c, ak = k < 0.0f ? -k : k;
    // FLT_MIN/FLT_MAX, not numeric_limits: unoptimised, its min()/max() became functions compiled
    // with this file's ISA flags and shared with generic code (kernels_isa_symbols, Debug build).
    if (ak >= FLT_MIN && ak <= FLT_MAX) {
        softcap_f32(s, 1, n, c, k, grad);
        return;
    }
    for (std::int64_t j = 0; j < n; ++j) s[j] *= scale;
    softcap_f32(s, 1, n, c, inv_c, grad);
}

}  // namespace
}  // namespace attn::detail
