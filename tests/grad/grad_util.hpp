// Helpers for the gradient tests: random tensors, poisoned outputs, a forward+backward
// runner, and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/tensor.hpp"

namespace attn::test {

inline Tensor randn(DType dt, Shape s, std::mt19937_64& rng, double sd = 1.0) {
    Tensor t(dt, s);
    std::normal_distribution<double> n(0.0, sd);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        if (dt == DType::f32) t.data_as<float>()[i] = static_cast<float>(n(rng));
        else t.data_as<double>()[i] = n(rng);
    }
    return t;
}

inline Tensor poisoned(DType dt, Shape s) {
    Tensor t(dt, s);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        if (dt == DType::f32) t.data_as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
        else t.data_as<double>()[i] = std::numeric_limits<double>::quiet_NaN();
    }
    return t;
}

inline double at(const TensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) {
    return t.load_as_double(t.offset(i0, i1, i2, i3));
}

struct Grads {
    Tensor out, lse, dq, dk, dv;
};

// Forward (reference, `dt` outputs) then backward with `impl`; outputs poisoned first.
inline Grads forward_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dO,
                              SdpaOptions opt, Impl impl, DType dt = DType::f32, SdpaReport* report = nullptr) {
    Grads g;
    const std::int64_t B = q.dim(0), Hq = q.dim(1), Lq = q.dim(2);
    g.out = poisoned(dt, Shape{B, Hq, Lq, v.dim(3)});
    g.lse = poisoned(dt, Shape{B, Hq, Lq});
    opt.impl = Impl::reference;
    TensorView lv = g.lse.view();
    sdpa(q, k, v, opt, g.out, &lv);
    g.dq = poisoned(dt, q.shape());
    g.dk = poisoned(dt, k.shape());
    g.dv = poisoned(dt, v.shape());
    opt.impl = impl;
    sdpa_backward(q, k, v, g.out, g.lse, dO, opt, g.dq, g.dk, g.dv, report);
    return g;
}

// max |a − b| (and max |b|); NaN/inf in a counts as +inf.
inline double max_abs_diff(const TensorView& a, const TensorView& b, double* max_b = nullptr) {
    double num = 0.0, den = 0.0;
    const Shape& s = b.shape();
    for (std::int64_t i0 = 0; i0 < s[0]; ++i0)
        for (std::int64_t i1 = 0; i1 < s[1]; ++i1)
            for (std::int64_t i2 = 0; i2 < s[2]; ++i2)
                for (std::int64_t i3 = 0; i3 < (s.rank > 3 ? s[3] : 1); ++i3) {
                    const double x = at(a, i0, i1, i2, i3), y = at(b, i0, i1, i2, i3);
                    if (!std::isfinite(x)) return std::numeric_limits<double>::infinity();
                    num = std::max(num, std::abs(x - y));
                    den = std::max(den, std::abs(y));
                }
    if (max_b) *max_b = den;
    return num;
}

inline double max_abs(const TensorView& a) {
    double m = 0.0;
    max_abs_diff(a, a, &m);
    return m;
}

inline bool bit_equal(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace attn::test
