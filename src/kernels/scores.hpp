// The score rule, written once for every kernel (reference, flash forward, backward, decode).
//
// For query i of query head h of sequence b and keys j0 .. j0+n−1, the kernel has computed
// s_j = scale · q·k_j in natural units (every kernel: base-2 scores would overflow for a
// finite mask value below −FLT_MAX/log2 e, e.g. Hugging Face's −FLT_MAX, and turn a
// finite score into −inf). The rule then applies, in this order:
//   1. score modifiers: softcap s = c·tanh(s / c), then ALiBi s −= m_h·|d_b(i) − j| with
//      d_b(i) = i + SdpaProblem::alibi_offset(b) (apply_score_modifiers)
//   2. + additive_mask[b, h, i, j]; an additive −inf selects −inf (a masked key), so a
//      NaN or +inf score plus −inf is −inf, not NaN; a float64 mask value beyond the
//      float32 range saturates to ±FLT_MAX (a finite mask value is a finite score)
//   3. −inf where bool_mask[b, h, i, j] is false
//   4. −inf outside the key interval [lo, hi) of SdpaProblem::key_range (causal, window,
//      key lengths — the one alignment rule)
// Steps 2 (for −inf), 3 and 4 assign (select, never multiply), so a masked key is −inf
// whatever its score or mask value was: NaN in K or +inf in a mask cannot leak through.
//
// `s` is a row with a stride: flash passes a column of its transposed Sᵀ tile (stride =
// the tile's leading dimension), backward and decode pass a row (stride 1).
//
// Internal linkage: each kernel translation unit (ISA files included) gets its own copy.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <limits>

#include "../sdpa/problem.hpp"
#include "simd/exp2.hpp"
#include "simd/tanh.hpp"

namespace attn::detail {
namespace {

// True when the rule can change a score whose key is inside the interval: kernels skip
// the rule for tiles that are entirely visible when this is false.
inline bool score_rule_has_elementwise(const SdpaProblem& p) {
    return p.has_elementwise_mask() || p.has_score_modifiers();
}

// c·tanh(s / c): the reference in double with std::tanh, the kernels with tanh_f32.
template <class T>
inline T softcap_value(T s, T c, T inv_c) {
    if constexpr (sizeof(T) == sizeof(double)) {
        return c * std::tanh(s * inv_c);
    } else {
        return c * tanh_f32(s * inv_c);
    }
}

// ALiBi alone: s[j] −= m_h·|d_b(i) − j| with the distance exact in int64.
template <class T>
inline void apply_alibi(const SdpaProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0,
                        std::int64_t n, T* s, std::ptrdiff_t stride) {
    const T m = static_cast<T>(p.alibi_slope(b, h));
    const std::int64_t d = i + p.alibi_offset(b);
    for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t dist = d - (j0 + j);
        s[j * stride] -= m * static_cast<T>(dist < 0 ? -dist : dist);
    }
}

// Step 1 of the rule on keys [j0, j0+n) of query i of head h of sequence b. With
// `softcap_grad` (stride 1), also stores 1 − tanh²(s / c) for the backward's chain rule.
template <class T>
inline void apply_score_modifiers(const SdpaProblem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                                  std::int64_t j0, std::int64_t n, T* s, std::ptrdiff_t stride,
                                  T* softcap_grad = nullptr) {
    if (p.softcap > 0.0) {
        const T c = static_cast<T>(p.softcap), inv_c = static_cast<T>(1.0 / p.softcap);
        if constexpr (sizeof(T) == sizeof(float)) {
            softcap_f32(s, stride, n, c, inv_c, softcap_grad);
        } else {
            for (std::int64_t j = 0; j < n; ++j) {
                const T t = std::tanh(s[j * stride] * inv_c);
                s[j * stride] = c * t;
                if (softcap_grad) softcap_grad[j] = T(1) - t * t;
            }
        }
    }
    if (p.alibi_slopes) apply_alibi<T>(p, b, h, i, j0, n, s, stride);
}

// s + a for an additive mask value a: −inf selects.
template <class T>
inline T add_mask_value(T s, T a) {
    return a == -std::numeric_limits<T>::infinity() ? a : s + a;
}

// A mask value in the kernel's precision. Into float32, finite float64 values saturate at
// ±FLT_MAX instead of overflowing to ±inf (which would turn a finite score into a masked key).
template <class T>
inline T mask_value(double a) {
    if constexpr (sizeof(T) == sizeof(double)) {
        return a;
    } else {
        constexpr double kMax = static_cast<double>(std::numeric_limits<float>::max());
        if (a < -kMax && a != -std::numeric_limits<double>::infinity()) return -std::numeric_limits<float>::max();
        if (a > kMax && a != std::numeric_limits<double>::infinity()) return std::numeric_limits<float>::max();
        return static_cast<float>(a);
    }
}

// The rule on keys [j0, j0+n) of query i of head h of sequence b: s[j·stride], T = float in
// the kernels, double in the reference.
// Steps 2–4 only (the masks): for a kernel that applied the modifiers itself (flash, tile-wide).
template <class T>
inline void apply_mask_rule(const SdpaProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0,
                            std::int64_t n, T* s, std::ptrdiff_t stride, KeyRange visible) {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    if (p.additive_mask) {
        const TensorView& m = *p.additive_mask;
        const std::int64_t o = m.offset(b, h, i, j0), sj = m.stride(3);
        if (m.dtype() == DType::f32) {
            const float* mp = m.data_as<const float>() + o;
            for (std::int64_t j = 0; j < n; ++j) s[j * stride] = add_mask_value<T>(s[j * stride], static_cast<T>(mp[j * sj]));
        } else {
            const double* mp = m.data_as<const double>() + o;
            for (std::int64_t j = 0; j < n; ++j) s[j * stride] = add_mask_value<T>(s[j * stride], mask_value<T>(mp[j * sj]));
        }
    }
    if (p.bool_mask) {
        const TensorView& m = *p.bool_mask;
        // bytes, not bool: any nonzero byte means "may attend"
        const auto* mp = m.data_as<const std::uint8_t>() + m.offset(b, h, i, j0);
        const std::int64_t sj = m.stride(3);
        for (std::int64_t j = 0; j < n; ++j)
            if (mp[j * sj] == 0) s[j * stride] = kNegInf;
    }
    // Keys outside [lo, hi): the part of the segment before lo and after hi.
    const std::int64_t a = visible.lo - j0 < 0 ? 0 : (visible.lo - j0 > n ? n : visible.lo - j0);
    const std::int64_t z = visible.hi - j0 < a ? a : (visible.hi - j0 > n ? n : visible.hi - j0);
    for (std::int64_t j = 0; j < a; ++j) s[j * stride] = kNegInf;
    for (std::int64_t j = z; j < n; ++j) s[j * stride] = kNegInf;
}

// The whole rule, steps 1–4.
template <class T>
inline void apply_score_rule(const SdpaProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0,
                             std::int64_t n, T* s, std::ptrdiff_t stride, KeyRange visible, T* softcap_grad = nullptr) {
    if (p.has_score_modifiers()) apply_score_modifiers<T>(p, b, h, i, j0, n, s, stride, softcap_grad);
    apply_mask_rule<T>(p, b, h, i, j0, n, s, stride, visible);
}

}  // namespace
}  // namespace attn::detail
