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
            for (std::int64_t e = 0; e < n; ++e) dst[e] = bf16_to_float(s[e * stride]);
            break;
        }
        case DType::f16: {
            const std::uint16_t* s = t.data_as<const std::uint16_t>() + offset;
            for (std::int64_t e = 0; e < n; ++e) dst[e] = f16_to_float(s[e * stride]);
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
