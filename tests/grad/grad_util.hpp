// Helpers for the gradient tests: a forward+backward runner on top of the shared helpers
// (random tensors, poison, error measures: common/util.hpp).
#pragma once

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

}  // namespace attn::test
