// Scalar element access for the slow, dtype-generic paths (the reference, the CLI).
// Kernels on the fast path read typed pointers directly.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::detail {

inline double load(const TensorView& t, std::int64_t offset) {
    if (t.dtype() == DType::f32) return static_cast<double>(t.data_as<const float>()[offset]);
    if (t.dtype() == DType::f64) return t.data_as<const double>()[offset];
    return t.load_as_double(offset);
}

// Writes a float32 or float64 element (validated by the caller).
inline void store(const TensorView& t, std::int64_t offset, double value) {
    if (t.dtype() == DType::f32) t.data_as<float>()[offset] = static_cast<float>(value);
    else t.data_as<double>()[offset] = value;
}

}  // namespace attn::detail
