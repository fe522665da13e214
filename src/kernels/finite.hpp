// Non-finite operands next to exact zeros: the one check every kernel uses before a
// product whose zero factor must select rather than multiply (docs/conventions.md,
// "Non-finite values"). A masked key has weight exactly 0, but 0·NaN = 0·inf = NaN, so
// a NaN or ±inf in V (or K, Q, dO) at a key a row cannot see would poison that row.
// Kernels check a block of the operand once (rows × cols loads against rows × cols ×
// (query rows) FMAs) and only when it holds a non-finite value take a selecting path:
// the product runs on a copy with those entries set to 0, and each of them is then
// added back, as p·x, only where its weight p is not 0.
//
// Internal linkage: compiled into each ISA's translation units (like scores.hpp).
#pragma once

#include <cstdint>
#include <cstring>

namespace attn::detail {
namespace {

// Bits of the exponent field of each storage format: all ones = NaN or ±inf.
inline constexpr std::uint32_t kF32Exponent = 0x7f800000u;
inline constexpr std::uint16_t kF16Exponent = 0x7c00u;
inline constexpr std::uint16_t kBF16Exponent = 0x7f80u;

inline bool nonfinite_f32(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return (u & kF32Exponent) == kF32Exponent;
}

// True when any element of the rows × cols block (row stride ld, unit column stride)
// is NaN or ±inf. Integer ops only (exponent field all ones, OR-ed over the block), so it
// vectorises with whatever the translation unit's ISA offers and never raises FP exceptions.
inline bool any_nonfinite(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t cols) {
    // An equality test per element, OR-ed: SSE2 has the 32-bit compare (pcmpeqd) but not the
    // unsigned max a running "worst exponent" needs, which GCC emulated in ~6 operations.
    std::uint32_t hit = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * ld;
        for (std::int64_t c = 0; c < cols; ++c) {
            std::uint32_t u;
            std::memcpy(&u, row + c, sizeof u);
            hit |= static_cast<std::uint32_t>((u & kF32Exponent) == kF32Exponent);
        }
    }
    return hit != 0;
}

// The same for 16-bit storage (float16: exponent 0x7c00, bfloat16: 0x7f80).
inline bool any_nonfinite16(const std::uint16_t* x, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                            std::uint16_t exponent) {
    std::uint16_t hit = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const std::uint16_t* row = x + r * ld;
        for (std::int64_t c = 0; c < cols; ++c)
            hit |= static_cast<std::uint16_t>((row[c] & exponent) == exponent);
    }
    return hit != 0;
}

// ── Large finite V ──────────────────────────────────────────────────────────────────
// A row's output is a weighted mean of V rows, at most max|v|, but kernels accumulate the
// unnormalised Σ p·v with p ≤ 1 and l = Σ p ≤ Lk (bf16 compute's lazy rescale: p ≤ 2^8,
// l ≤ 2^8·Lk): with |v| near FLT_MAX (or above FLT_MAX / Lk) that sum overflows fp32 although
// the mean does not. Kernels therefore
// accumulate unchecked (the common path pays nothing) and, only when a task's accumulator
// ends non-finite, compute that task again on the *careful path*: every V entry with
// |v| ≥ 2^64 is taken out of the ordinary sum (set to 0 there, like a non-finite entry)
// and summed, scaled by 2^-64, into a second accumulator. The scaling is by a power of two
// on a normal number, so exact; both sums stay below Lk·2^72 < 2^127 for Lk < 2^55, and
// the ordinary entries keep exactly the rounding they have on the common path. The output
// is ordinary/l + large·(2^64/l). A non-finite entry is 0 in both parts and added back
// as p·x where p is not 0 (the selecting path above), so a visible NaN/±inf still gives a
// NaN/±inf row after the careful pass — which is then only wasted work, never a different result.
inline constexpr std::uint32_t kF32Large = (127u + 64u) << 23;  // exponent field of 2^64
inline constexpr float kLargeDown = 0x1p-64f;
inline constexpr float kLargeUp = 0x1p64f;

// x → (ordinary part, large part scaled by 2^-64); non-finite x: both 0, returns true.
inline bool split_large(float x, float& ordinary, float& large) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    u &= kF32Exponent;
    if (u == kF32Exponent) {
        ordinary = large = 0.0f;
        return true;
    }
    const bool big = u >= kF32Large;
    ordinary = big ? 0.0f : x;
    large = big ? x * kLargeDown : 0.0f;
    return false;
}

// A weighted mean of finite values is at most their largest magnitude ≤ FLT_MAX; computed in
// fp32 it can still round past FLT_MAX (V = FLT_MAX everywhere: Σ p·v and l = Σ p round
// differently). Such an overflow of a mean of finite values is a rounding artefact of a few
// ulps, and FLT_MAX (with its sign) is then the correctly rounded answer. Not for dropout,
// whose 1/(1−p) factor can take the true value past FLT_MAX.
inline float saturate_mean(float x) {
    constexpr float kMax = 3.40282347e38f;
    return x > kMax ? kMax : (x < -kMax ? -kMax : x);
}

// o/l of the careful path from the two accumulators and inv = 1/l. inv·2^64 is exact and
// finite: l ≥ 1 whenever a key is visible (the key with the maximum score has p = 1; in the
// SIMD softmaxes' fused form 2^r ≥ 1 − 2^-16, flash_avx512.cpp: l ≥ 1 − 2^-16, as good).
// `mean`: no dropout, so the result of finite parts is a mean (saturate_mean).
// large = 0 (no value the row weighed was large): ordinary·inv alone, the clean pass's o·inv —
// adding the +0 turned a −0 into +0: a row whose mean of tiny negative values underflows (its
// correctly rounded value, which the clean pass and the reference give, is −0).
inline float combine_large(float ordinary, float large, float inv, bool mean) {
    const float r = large == 0.0f ? ordinary * inv : ordinary * inv + large * (inv * kLargeUp);
    const bool finite_parts = !nonfinite_f32(ordinary) && !nonfinite_f32(large) && !nonfinite_f32(inv);
    return mean && finite_parts ? saturate_mean(r) : r;
}

}  // namespace
}  // namespace attn::detail
