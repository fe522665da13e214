// 2^x, the one exp of every kernel (flash forward, backward, decode all work in base 2 or
// turn exp(x) into 2^(x·log2 e)); the portable path (exp2_scalar below) and AVX2
// (exp2_avx2.hpp) use this range reduction and polynomial, AVX-512 a floor reduction and its
// own fit of the same degree and error (d1 … d6 below: no subtract for n, no upper clamp).
//
//   x = n + f,  n = round-to-nearest(x),  f in [−0.5, 0.5]
//   2^x = 2^n · p(f),   p(f) = 1 + c1·f + … + c6·f⁶   (Horner)
//   2^n is put into the exponent field by an integer add (n << 23), so no multiply.
//
// The coefficients are a relative-error minimax fit of 2^f on [−0.5, 0.5] (iteratively
// reweighted least squares in double, rounded to float). Evaluated in float32 with FMA
// the max relative error is 7.9e-8 (≈ 1.3 units of 2^-24); the portable path without
// FMA measures ≈ 1.2e-7. tests/kernels/test_exp2.cpp checks every kernel table's exp2
// against a bound of 2.5e-7 (≈ 2 ulp) on a dense sweep of [−126, 127.9]. In the softmax this error is far below
// the rounding of the fp32 dot products that feed it.
// Inputs below −126 give 0 (the result would be subnormal; a softmax weight below
// 1.2e-38 is 0 for every purpose here, and exact 0 keeps 0·inf out of P·V for a
// masked key whose value is inf).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace attn::detail::exp2poly {

inline constexpr float c1 = 0.6931471824645996f;
inline constexpr float c2 = 0.24022647738456726f;
inline constexpr float c3 = 0.055503323674201965f;
inline constexpr float c4 = 0.00961843691766262f;
inline constexpr float c5 = 0.001339887036010623f;
inline constexpr float c6 = 0.0001535360497655347f;

// The AVX-512 row's fit (exp2_avx512.hpp): the same degree on the other width-1 interval,
//   x = n + g,  n = floor(x),  g in [0, 1),   2^g ≈ 1 + d1·g + … + d6·g⁶,
// because vscalefps multiplies by 2^floor(its second operand) itself: given x unreduced, it
// needs neither n = x − f (a subtract) nor the upper clamp (2^n overflows to inf in the
// instruction; the clamp guarded the integer add). A relative-error minimax fit of 2^g on
// [0, 1] with d0 = 1 (so 2^n is exact), by the same method, rounded to float: 1.3e-8 in exact
// arithmetic, 8.3e-8 (≈ 1.4 units of 2^-24) evaluated with FMA over every float in [−126, 0]
// (the fit above: 8.0e-8 there). The same test and bound as every row (test_exp2.cpp).
inline constexpr float d1 = 0.6931470632553101f;
inline constexpr float d2 = 0.2402293086051941f;
inline constexpr float d3 = 0.055485282093286514f;
inline constexpr float d4 = 0.009675451554358006f;
inline constexpr float d5 = 0.0012467842316254973f;
inline constexpr float d6 = 0.00021612927957903594f;

inline constexpr float kMin = -126.0f;  // below: result 0
inline constexpr float kMax = 128.0f;   // at or above: +inf

// Scalar version (the portable path). Written without branches or library calls
// (rounding by the 1.5·2^23 trick instead of nearbyint, which is a libm call on baseline
// x86-64) so the compiler can vectorise loops over it with the baseline ISA.
inline float exp2_scalar(float x) {
    // clamp; NaN becomes 0 here (float→int of NaN is undefined) and is restored at the end
    const float xc = x < -127.0f ? -127.0f : (x > kMax ? kMax : (x == x ? x : 0.0f));
    const float magic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer (ties to even)
    const float n = (xc + magic) - magic;
    const float f = xc - n;
    float p = c6;
    p = p * f + c5;
    p = p * f + c4;
    p = p * f + c3;
    p = p * f + c2;
    p = p * f + c1;
    p = p * f + 1.0f;
    std::uint32_t bits;  // unsigned: the exponent add wraps by definition
    std::memcpy(&bits, &p, sizeof bits);
    bits += static_cast<std::uint32_t>(static_cast<std::int32_t>(n)) << 23;
    std::memcpy(&p, &bits, sizeof p);
    return x < kMin ? 0.0f : (x != x ? x : p);
}

}  // namespace attn::detail::exp2poly
