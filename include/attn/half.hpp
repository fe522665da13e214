// Portable scalar conversions between float and the 16-bit storage types.
// (Vector kernels use F16C; these are the reference conversions they are tested against.)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace attn {

inline float f16_to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    std::uint32_t bits;
    if (exp == 0x1f) {  // inf / nan
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Round to nearest even, as numpy and F16C do.
inline std::uint16_t float_to_f16(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or nan (keep nan quiet and non-zero)
        return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow
    if (abs < 0x38800000u) {  // result is subnormal or zero
        if (abs < 0x33000000u) return sign;
        const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
        std::uint32_t r = mant >> shift;
        const std::uint32_t rem = mant & ((1u << shift) - 1u);
        const std::uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return static_cast<std::uint16_t>(sign | r);
    }
    std::uint32_t r = ((abs - 0x38000000u) >> 13);
    const std::uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
}

inline float bf16_to_float(std::uint16_t h) {
    const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline std::uint16_t float_to_bf16(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
    const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return static_cast<std::uint16_t>((x + rounding) >> 16);
}

// x rounded to float32 by rounding to odd: an inexact result is the neighbour whose last bit is
// 1. As the first of two roundings it keeps the fact that x was not exact, so the second one
// (float16: 11 significant bits, bfloat16: 8, both ≤ 24 − 2) rounds as x itself would.
inline float round_to_odd_float(double x) {
    float f = static_cast<float>(x);
    if (!std::isfinite(f) || static_cast<double>(f) == x) return f;  // exact, NaN, or overflow to ±inf
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 1u) == 0) bits += std::fabs(static_cast<double>(f)) < std::fabs(x) ? 1u : 0xffffffffu;  // ±1 ulp toward x
    std::memcpy(&f, &bits, 4);
    return f;
}

// double → float16 / bfloat16, rounded once to nearest even. Through float32 by plain rounding
// it was rounded twice: 1 + 2^-11 + 2^-40 became 1 (a float32 tie), not 1 + 2^-10.
inline std::uint16_t double_to_f16(double x) { return float_to_f16(round_to_odd_float(x)); }
inline std::uint16_t double_to_bf16(double x) { return float_to_bf16(round_to_odd_float(x)); }

}  // namespace attn
