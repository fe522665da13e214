// Helpers for the gradient tests: a forward+backward runner on top of the shared helpers
// (random tensors, poison, error measures: common/util.hpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

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
// scales 2^e they run, from the smallest normal float32 up (63 and 64 either side of
// split_scale's upper threshold, backward_plan.hpp), and the scale 2^kBaseScaleExponent of the
// problem they are compared with (2^-5 keeps |Q·K| below FLT_MAX with K times 2^121). Above 2^99
// Q·K would hold float32 subnormals (Q and K of order 2^-52 each at 2^99): no bit-exact twin.
inline constexpr int kScaleExponents[] = {-126, -125, -116, -100, -66, 0, 33, 63, 64, 99};
inline constexpr int kBaseScaleExponent = -5;

// Where the problem at scale s0·2^-a puts the 2^a: Q times 2^q and K times 2^k, q + k = a, and
// dO times 2^o. Its scores are s0's, so its exact dQ is 2^(o-q) times s0's, dK 2^(o-k) times
// and dV 2^o times.
struct Pow2Split {
    int q, k, o;
};

// K alone, then Q alone (a >= -104 keeps unit-scale values times 2^a normal). Above 2^63 also
// half on each with dO times 2^40: P∘(dP − D) is then of order 2^40, so scale·P∘(dP − D) passes
// FLT_MAX at 2^99 while every gradient stays below 2^93.
inline std::vector<Pow2Split> pow2_splits(int a) {
    std::vector<Pow2Split> s{{0, a, 0}, {a, 0, 0}};
    if (a < kBaseScaleExponent - 63) s.push_back({a / 2, a - a / 2, 40});
    return s;
}

// t ← t·2^a in place (exact while the values stay normal): moves a power of two between the
// scale and Q or K, which leaves the scores, so P and scale·dS, unchanged.
inline void times_pow2(const TensorView& t, int a) {
    for_each_offset(t, [&](std::int64_t off) { store(t, off, std::ldexp(load(t, off), a)); });
}

// The problem of split sp made from its twin at s0 (inputs with members q, k, dO), and its
// gradients (members dq, dk, dv) brought back to the twin's: exact while the values stay normal.
template <class In>
void apply_split(In& in, const Pow2Split& sp) {
    times_pow2(in.q, sp.q);
    times_pow2(in.k.view(), sp.k);
    times_pow2(in.dO, sp.o);
}
template <class G>
void undo_split(G& g, const Pow2Split& sp) {
    times_pow2(g.dq.view(), sp.q - sp.o);
    times_pow2(g.dk.view(), sp.k - sp.o);
    times_pow2(g.dv.view(), -sp.o);
}

// The gradients split sp does not shrink (dV, and dQ or dK unless it is 2^(o-q) or 2^(o-k) < 1
// times the twin's: a subnormal may have lost bits), brought back by undo_split, are the twin's
// `base` bit for bit.
template <class G>
void expect_twin_bits(const G& got, const G& base, const Pow2Split& sp) {
    if (sp.o >= sp.q) {  // braces: EXPECT_TRUE is an if-else inside (-Wdangling-else)
        EXPECT_TRUE(bit_equal(got.dq, base.dq)) << "dq differs from the run at the base scale";
    }
    if (sp.o >= sp.k) {
        EXPECT_TRUE(bit_equal(got.dk, base.dk)) << "dk differs from the run at the base scale";
    }
    EXPECT_TRUE(bit_equal(got.dv, base.dv)) << "dv differs from the run at the base scale";
}

// The huge-scale problem of docs/conventions.md ("Shapes of attn::sdpa"): one head of 65 queries
// and keys, unit-scale (randn) Q, K, V and dO of head dim 32 in `dt`, the flash forward's out (in
// `dt`) and lse at `scale`, then the backward (on the kernel set in use) with gradients in `dt`.
// Every gradient must be finite, and |dV_jd| <= Σ_i |dO_id|·(1 + slack): dV = Σ_i P_ij·dO_id with
// 0 <= P <= 1. Returns the backward's kernel.
inline std::string expect_finite_gradients_at_huge_scale(DType dt, double scale, double slack) {
    const std::int64_t L = 65, D = 32;
    std::mt19937_64 rng(7);
    const Tensor q = randn(dt, Shape{1, 1, L, D}, rng), k = randn(dt, Shape{1, 1, L, D}, rng),
                 v = randn(dt, Shape{1, 1, L, D}, rng), dO = randn(dt, Shape{1, 1, L, D}, rng);
    SdpaOptions opt;
    opt.scale = scale;
    opt.impl = Impl::flash;
    Tensor out(dt, Shape{1, 1, L, D}), lse(DType::f32, Shape{1, 1, L});
    TensorView lv = lse.view();
    sdpa(q, k, v, opt, out, &lv);
    Tensor dq = poisoned(dt, q.shape()), dk = poisoned(dt, k.shape()), dv = poisoned(dt, v.shape());
    SdpaReport rep;
    sdpa_backward(q, k, v, out, lse, dO, opt, dq, dk, dv, &rep);
    for (const auto& [name, g] : {std::pair{"dQ", &dq}, std::pair{"dK", &dk}, std::pair{"dV", &dv}})
        for (std::int64_t e = 0; e < g->numel(); ++e) {
            const double x = load(g->view(), e);
            if (!std::isfinite(x)) {
                ADD_FAILURE() << name << "[" << e << "] = " << x << " at scale " << scale;
                return rep.kernel;
            }
        }
    for (std::int64_t d = 0; d < D; ++d) {
        double bound = 0.0;
        for (std::int64_t i = 0; i < L; ++i) bound += std::fabs(at(dO.view(), 0, 0, i, d));
        bound *= 1.0 + slack;
        for (std::int64_t j = 0; j < L; ++j)
            if (std::fabs(at(dv.view(), 0, 0, j, d)) > bound) {
                ADD_FAILURE() << "dV[" << j << "][" << d << "] = " << at(dv.view(), 0, 0, j, d) << " > " << bound
                              << " = the sum of |dO[.][" << d << "]| at scale " << scale;
                return rep.kernel;
            }
    }
    return rep.kernel;
}

}  // namespace attn::test
