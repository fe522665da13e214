// Helpers for the gradient tests: a forward+backward runner on top of the shared helpers
// (random tensors, poison, error measures: common/util.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "common/util.hpp"

namespace attn::test {

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

// The backward's tiny- and huge-scale tests (FlashBackward.TinyAndHugeScales says how): the
// scales 2^e they run, from the smallest normal float32 up, and the scale 2^kBaseScaleExponent of
// the problem they are compared with (2^-5 keeps |Q·K| below FLT_MAX with K times 2^121).
inline constexpr int kScaleExponents[] = {-126, -125, -116, -100, -66, 0, 33, 99};
inline constexpr int kBaseScaleExponent = -5;

// t ← t·2^a in place (exact while the values stay normal): moves a power of two between the
// scale and Q or K, which leaves the scores, so P and scale·dS, unchanged.
inline void times_pow2(const TensorView& t, int a) {
    for_each_offset(t, [&](std::int64_t off) { store(t, off, std::ldexp(load(t, off), a)); });
}

}  // namespace attn::test
