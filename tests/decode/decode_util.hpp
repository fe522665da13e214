// Helpers shared by the decode tests: random tensors, 16-bit copies, comparison with the
// double-precision reference, error bounds.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "attn/half.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn::test {

inline Tensor random_f32(const Shape& s, std::mt19937& rng, float sd = 1.0f) {
    Tensor t(DType::f32, s);
    std::normal_distribution<float> nd(0.0f, sd);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = nd(rng);
    return t;
}

inline void poison(const TensorView& t) {
    float* p = t.data_as<float>();
    // Poison the whole extent the view spans (views here are contiguous).
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
}

// A contiguous copy of a float32 tensor in `dt` (f32, f16, bf16), rounded as the scalar
// conversions of half.hpp round (round to nearest even).
inline Tensor to_storage(const Tensor& src, DType dt) {
    Tensor out(dt, src.shape());
    const float* s = src.data_as<float>();
    for (std::int64_t i = 0; i < src.numel(); ++i) {
        if (dt == DType::f32) out.data_as<float>()[i] = s[i];
        else if (dt == DType::f16) out.data_as<std::uint16_t>()[i] = float_to_f16(s[i]);
        else out.data_as<std::uint16_t>()[i] = float_to_bf16(s[i]);
    }
    return out;
}

// Unit roundoff of a storage type.
inline double unit_roundoff(DType dt) {
    return dt == DType::f16 ? std::ldexp(1.0, -11) : dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
}

struct Diff {
    double max_abs = 0;     // worst |got − want|
    double worst_ratio = 0; // worst |got − want| / tolerance
    std::int64_t at = -1;
    std::int64_t bad = 0;   // elements beyond tolerance (NaN counts)
};

// Element-wise |got − want| <= atol + rtol·|want| over two same-shape contiguous float32
// tensors; −inf must match −inf exactly.
inline Diff compare(const TensorView& got, const TensorView& want, double atol, double rtol) {
    Diff d;
    for (std::int64_t i = 0; i < got.numel(); ++i) {
        const double g = got.data_as<const float>()[i], w = want.data_as<const float>()[i];
        if (std::isinf(w) || std::isinf(g)) {
            if (g != w) ++d.bad, d.at = i, d.worst_ratio = INFINITY;
            continue;
        }
        const double e = std::fabs(g - w), tol = atol + rtol * std::fabs(w);
        if (!(e <= tol)) ++d.bad;
        if (!(e <= d.max_abs)) d.max_abs = std::isnan(e) ? INFINITY : e;
        if (!(e / tol <= d.worst_ratio)) d.worst_ratio = std::isnan(e) ? INFINITY : e / tol, d.at = i;
    }
    return d;
}

}  // namespace attn::test
