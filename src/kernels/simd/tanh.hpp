// The softcap's tanh in float32 (docs/conventions.md, "Score modifiers"), written once for
// every kernel: scores.hpp (flash forward, decode, the backward's rule callback) and the
// backward tile (tile_body.inl) include it. Internal linkage: each translation unit, ISA
// files included, compiles its own copy with its own vector width.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "exp2.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attn::detail {
namespace {

// tanh in float32 for the softcap, a vector at a time in GCC/Clang vector extensions: a plain loop over a scalar
// tanh does not vectorise — GCC keeps the branches of the exp2's range checks with the
// default -ftrapping-math. The exp2 is exp2.hpp's polynomial, the one of every kernel:
//   |x| >= 1/8: tanh|x| = 1 − 2/(2^{2|x|·log2 e} + 1)   (2^y = inf for y >= 128 gives 1)
//   |x| <  1/8: x − x³/3 + 2x⁵/15 − 17x⁷/315            (the formula above cancels there;
//               the first omitted term is < 1.6e-10 relative)
// NaN stays NaN. tests/kernels/test_modifiers.cpp measures the error.
// The width follows the translation unit's ISA: 16 lanes with AVX-512 (the flash_avx512 file:
// one zmm per op, half the instructions of two ymm — the softcap pass is compute-bound there),
// 8 where AVX is enabled, 4 (SSE2, the x86-64 baseline) elsewhere — so no 32-byte vector is
// ever passed without AVX, and no 64-byte one without AVX-512. Every lane computes the same.
#if defined(__AVX512F__)
inline constexpr int kTanhLanes = 16;
#elif defined(__AVX__)
inline constexpr int kTanhLanes = 8;
#else
inline constexpr int kTanhLanes = 4;
#endif
typedef float vfloat __attribute__((vector_size(4 * kTanhLanes)));
typedef std::int32_t vint __attribute__((vector_size(4 * kTanhLanes)));

// always_inline: GCC kept it out of line (one call per vector), and a call clobbers every
// vector register — the flash micro-kernel's 16 accumulators were spilled around each call.
__attribute__((always_inline)) inline vfloat tanh_vec(vfloat x) {
    constexpr float kTwoLog2e = 2.8853900817779268f;  // 2·log2 e
    vint xi;
    std::memcpy(&xi, &x, sizeof xi);
    const vint sign = xi & std::int32_t(0x80000000u);
    const vint axi = xi & 0x7fffffff;
    vfloat ax;
    std::memcpy(&ax, &axi, sizeof ax);
    vfloat y = ax * kTwoLog2e;
    // Clamped at 64 (NaN → 64 here; restored below): 2^64 keeps e + 1 finite for the
    // reciprocal below, and 1 − 2/(2^64 + 1) is 1 in float32 already (from |x| ≈ 9 on).
    y = y < 64.0f ? y : vfloat{} + 64.0f;
    const vfloat n = (y + 12582912.0f) - 12582912.0f;  // round to nearest (1.5·2^23 trick)
    const vfloat f = y - n;
    vfloat pe = f * exp2poly::c6 + exp2poly::c5;
    pe = pe * f + exp2poly::c4;
    pe = pe * f + exp2poly::c3;
    pe = pe * f + exp2poly::c2;
    pe = pe * f + exp2poly::c1;
    pe = pe * f + 1.0f;
    vint bits;
    std::memcpy(&bits, &pe, sizeof bits);
    bits += __builtin_convertvector(n, vint) << 23;
    vfloat e;
    std::memcpy(&e, &bits, sizeof e);
#if defined(__AVX512F__)
    // 2/(e+1) without a division (vdivps zmm is the softcap pass's slowest instruction):
    // rcp14 (relative error < 2^-14) and one Newton step, rc·(1 + (1 − d·rc)), error ~2^-28 + 1 ulp,
    // below the bound tests/kernels/test_modifiers.cpp checks on this ISA.
    const vfloat d = e + 1.0f;
    vfloat rc = _mm512_rcp14_ps(d);
    rc = rc + rc * (1.0f - d * rc);
    const vfloat big = 1.0f - 2.0f * rc;
#else
    const vfloat big = 1.0f - 2.0f / (e + 1.0f);
#endif
    const vfloat x2 = ax * ax;
    const vfloat small = ax * (1.0f + x2 * (-0.33333334f + x2 * (0.13333334f + x2 * -0.05396825f)));
    const vfloat t = ax < 0.125f ? small : big;
    vint ti;
    std::memcpy(&ti, &t, sizeof ti);
    ti |= sign;
    vfloat r;
    std::memcpy(&r, &ti, sizeof r);
    return x == x ? r : x;
}

// The same function on one value (lane 0), for scalar callers and tests.
inline float tanh_f32(float x) {
    const vfloat v = vfloat{} + x;
    return tanh_vec(v)[0];
}

// s[j·stride] ← c·tanh(s[j·stride]·inv_c) for j < n, a vector at a time; with `grad` (stride 1)
// also grad[j] = 1 − tanh².
inline void softcap_f32(float* s, std::ptrdiff_t stride, std::int64_t n, float c, float inv_c, float* grad) {
    for (std::int64_t j0 = 0; j0 < n; j0 += kTanhLanes) {
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

}  // namespace
}  // namespace attn::detail
