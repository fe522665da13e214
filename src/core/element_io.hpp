// Scalar element access for the slow, dtype-generic paths (the reference, the CLI).
// Kernels on the fast path read typed pointers directly.
#pragma once

#include <cstdint>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

inline double load(const TensorView& t, std::int64_t offset) {
    if (t.dtype() == DType::f32) return static_cast<double>(t.data_as<const float>()[offset]);
    if (t.dtype() == DType::f64) return t.data_as<const double>()[offset];
    return t.load_as_double(offset);
}

// Writes a float32, float64, float16 or bfloat16 element (validated by the caller). A
// 16-bit element is `value` rounded once (round to nearest even): for a kernel's float32
// result, that result rounded once more — the stated bound of a 16-bit output is "one rounding
// of the float32 result" —, and a float64 value straight to 16 bits, never through float32.
inline void store(const TensorView& t, std::int64_t offset, double value) {
    switch (t.dtype()) {
        case DType::f32: t.data_as<float>()[offset] = static_cast<float>(value); break;
        case DType::f16: t.data_as<std::uint16_t>()[offset] = double_to_f16(value); break;
        case DType::bf16: t.data_as<std::uint16_t>()[offset] = double_to_bf16(value); break;
        default: t.data_as<double>()[offset] = value; break;
    }
}

}  // namespace attn::detail
