// Widening a strided row of a float32 / float16 / bfloat16 (or float64) tensor to float32,
// for the packers of the portable kernel drivers (flash backward tiles). One place for the
// dtype switch; the scalar conversions are attn/half.hpp's (exact: every 16-bit value is a
// float32). bf16 is a 16-bit shift, a contiguous f32 row a copy: both loops vectorise at
// the baseline ISA. float16 goes through the portable scalar conversion (F16C lives in the
// per-ISA files, which this portable header must not need).
#pragma once

#include <cstdint>
#include <cstring>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

// float16 bits → float32, exactly, without branches (so loops over it vectorise): the
// exponent/mantissa bits shifted into float32 position are the value times 2^-112 (a normal
// float16 as a normal float32, a subnormal as a float32 subnormal), so one exact multiply by
// 2^112 rebiases both; exponent 0x1f (inf, NaN) maps to float32's all-ones exponent. Equal
// to attn::f16_to_float for all 65536 inputs (tests/half), unless the thread flushes
// float32 subnormal inputs to zero (DAZ), which attn clears while it computes (core/float_env.hpp).
inline float f16_bits_to_float(std::uint16_t h) {
    const std::uint32_t em = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
    float mag;
    std::memcpy(&mag, &em, 4);
    mag *= 0x1p112f;
    std::uint32_t bits;
    std::memcpy(&bits, &mag, 4);
    bits = em >= (0x7c00u << 13) ? (em | 0x7f800000u) : bits;
    bits |= static_cast<std::uint32_t>(h & 0x8000u) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// dst[e] = float(t[offset + e·stride]) for e < n.
inline void widen_row(const TensorView& t, std::int64_t offset, std::int64_t stride, std::int64_t n, float* dst) {
    switch (t.dtype()) {
        case DType::f32: {
            const float* s = t.data_as<const float>() + offset;
            if (stride == 1) std::memcpy(dst, s, sizeof(float) * static_cast<std::size_t>(n));
            else
                for (std::int64_t e = 0; e < n; ++e) dst[e] = s[e * stride];
            break;
        }
        case DType::bf16: {
            const std::uint16_t* s = t.data_as<const std::uint16_t>() + offset;
            if (stride == 1)  // the common case, written apart so that it vectorises
                for (std::int64_t e = 0; e < n; ++e) dst[e] = bf16_to_float(s[e]);
            else
                for (std::int64_t e = 0; e < n; ++e) dst[e] = bf16_to_float(s[e * stride]);
            break;
        }
        case DType::f16: {
            const std::uint16_t* s = t.data_as<const std::uint16_t>() + offset;
            if (stride == 1)
                for (std::int64_t e = 0; e < n; ++e) dst[e] = f16_bits_to_float(s[e]);
            else
                for (std::int64_t e = 0; e < n; ++e) dst[e] = f16_bits_to_float(s[e * stride]);
            break;
        }
        default: {  // float64 (the drivers take it only where rounding to float32 is the contract)
            const double* s = t.data_as<const double>() + offset;
            for (std::int64_t e = 0; e < n; ++e) dst[e] = static_cast<float>(s[e * stride]);
            break;
        }
    }
}

}  // namespace attn::detail
