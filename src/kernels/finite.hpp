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
// is NaN or ±inf. Integer ops only (max of the exponent fields), so it vectorises with
// whatever the translation unit's ISA offers and never raises FP exceptions.
inline bool any_nonfinite(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t cols) {
    std::uint32_t worst = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * ld;
        for (std::int64_t c = 0; c < cols; ++c) {
            std::uint32_t u;
            std::memcpy(&u, row + c, sizeof u);
            u &= kF32Exponent;
            worst = u > worst ? u : worst;
        }
    }
    return worst == kF32Exponent;
}

// The same for 16-bit storage (float16: exponent 0x7c00, bfloat16: 0x7f80).
inline bool any_nonfinite16(const std::uint16_t* x, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                            std::uint16_t exponent) {
    std::uint16_t worst = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const std::uint16_t* row = x + r * ld;
        for (std::int64_t c = 0; c < cols; ++c) {
            const std::uint16_t u = static_cast<std::uint16_t>(row[c] & exponent);
            worst = u > worst ? u : worst;
        }
    }
    return worst == exponent;
}

}  // namespace
}  // namespace attn::detail
