// Gradients with score modifiers (softcap, ALiBi, sinks):
//   - the reference backward (float64) against central finite differences of the reference
//     forward, for dQ, dK, dV and dsinks, with masks, GQA, key lengths;
//   - the tiled backward (every kernel table row; 1 and 2 threads bit-identical) against the
//     reference backward on random cases, every modifier alone and combined with the masks.
// tests/grad/test_grad_torch.py checks both against torch autograd of the textbook formula.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <random>
#include <string>

#include "attn/error.hpp"
#include "grad_util.hpp"
#include "kernels/isa.hpp"

namespace attn::test {
namespace {

struct Case {
    Tensor q, k, v, dO, bool_mask, kl, slopes, sinks;
    SdpaOptions opt;
    std::string desc;
};

Case make_case(std::mt19937_64& rng, DType dt, std::int64_t B, std::int64_t Hkv, std::int64_t G, std::int64_t Lq,
               std::int64_t Lk, std::int64_t D, int mask, int mods) {
    Case c;
    const std::int64_t Hq = Hkv * G;
    c.q = randn(dt, Shape{B, Hq, Lq, D}, rng, 1.5);
    c.k = randn(dt, Shape{B, Hkv, Lk, D}, rng, 1.5);
    c.v = randn(dt, Shape{B, Hkv, Lk, D}, rng);
    c.dO = randn(dt, Shape{B, Hq, Lq, D}, rng);
    c.desc = "B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " Lq=" +
             std::to_string(Lq) + " Lk=" + std::to_string(Lk) + " D=" + std::to_string(D) + " mask=" +
             std::to_string(mask) + " mods=" + std::to_string(mods);
    switch (mask) {
        case 1: c.opt.causal = Causal::top_left; break;
        case 2: {
            c.kl = Tensor(DType::i64, Shape{B});
            for (std::int64_t b = 0; b < B; ++b) c.kl.data_as<std::int64_t>()[b] = std::max<std::int64_t>(0, Lk - 3 * b);
            c.opt.key_lengths = c.kl;
            c.opt.causal = Causal::bottom_right;
            break;
        }
        case 3:
            c.bool_mask = random_bool(Shape{B, Hq, Lq, Lk}, rng, 0.6);
            c.opt.bool_mask = c.bool_mask;
            break;
        case 4: c.opt.window = Window{4, 1, Align::bottom_right}; break;
    }
    if (mods & 1) c.opt.softcap = 2.5;
    if (mods & 2) {
        c.slopes = rand_uniform(DType::f32, Shape{B, Hq}, rng, 0.0, 0.4);
        c.opt.alibi_slopes = c.slopes;
    }
    if (mods & 4) {
        c.sinks = randn(DType::f32, Shape{Hq}, rng, 1.5);
        c.opt.sinks = c.sinks;
    }
    return c;
}

// Σ out ∘ dO of the reference forward in double.
double loss(const Case& c) {
    const TensorView q = c.q, v = c.v;
    Tensor out(DType::f64, Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
    SdpaOptions o = c.opt;
    o.impl = Impl::reference;
    sdpa(c.q, c.k, c.v, o, out);
    double s = 0;
    for_each_index(out.shape(), [&](const Index& i) { s += at(out, i[0], i[1], i[2], i[3]) * at(c.dO, i[0], i[1], i[2], i[3]); });
    return s;
}

struct AllGrads {
    Grads g;
    Tensor dsinks;
};

AllGrads backward(const Case& c, Impl impl, DType dt) {
    AllGrads r;
    const TensorView q = c.q;
    r.g.out = poisoned(dt, Shape{q.dim(0), q.dim(1), q.dim(2), c.v.shape()[3]});
    r.g.lse = poisoned(dt, Shape{q.dim(0), q.dim(1), q.dim(2)});
    SdpaOptions o = c.opt;
    o.impl = Impl::reference;
    TensorView lv = r.g.lse;
    sdpa(c.q, c.k, c.v, o, r.g.out, &lv);
    r.g.dq = poisoned(dt, c.q.shape());
    r.g.dk = poisoned(dt, c.k.shape());
    r.g.dv = poisoned(dt, c.v.shape());
    o.impl = impl;
    TensorView ds;
    if (c.opt.sinks) {
        r.dsinks = poisoned(dt, Shape{q.dim(1)});
        ds = r.dsinks;
    }
    sdpa_backward(c.q, c.k, c.v, r.g.out, r.g.lse, c.dO, o, r.g.dq, r.g.dk, r.g.dv, nullptr,
                  c.opt.sinks ? &ds : nullptr);
    return r;
}

// Central differences of loss() at a few elements of `x` (float64 storage), against `grad`.
void check_fd(Case& c, Tensor& x, const Tensor& grad, const char* name, std::mt19937_64& rng) {
    const double h = 1e-6;
    std::uniform_int_distribution<std::int64_t> pick(0, x.numel() - 1);
    for (int n = 0; n < 6; ++n) {
        const std::int64_t e = pick(rng);
        double* p = static_cast<double*>(x.data()) + e;
        const double x0 = *p;
        *p = x0 + h;
        const double lp = loss(c);
        *p = x0 - h;
        const double lm = loss(c);
        *p = x0;
        const double fd = (lp - lm) / (2 * h);
        const double g = static_cast<const double*>(grad.data())[e];
        EXPECT_NEAR(g, fd, 1e-7 + 1e-6 * std::abs(fd)) << name << " element " << e << " " << c.desc;
    }
}

TEST(ModifierGrads, ReferenceMatchesFiniteDifferences) {
    std::mt19937_64 rng(41);
    for (int mask = 0; mask < 5; ++mask)
        for (int mods : {1, 2, 4, 7}) {
            Case c = make_case(rng, DType::f64, 2, 2, 2, 5, 7, 4, mask, mods);
            const AllGrads r = backward(c, Impl::reference, DType::f64);
            check_fd(c, c.q, r.g.dq, "dq", rng);
            check_fd(c, c.k, r.g.dk, "dk", rng);
            check_fd(c, c.v, r.g.dv, "dv", rng);
            if (mods & 4) {
                // sinks are float32: differentiate on a float64 copy seen through a float32 view?
                // No — step the float32 value by a representable h and divide by the actual step.
                for (std::int64_t hh = 0; hh < c.sinks.numel(); ++hh) {
                    float* s = c.sinks.data_as<float>() + hh;
                    const float s0 = *s, sp = s0 + 1e-3f, sm = s0 - 1e-3f;
                    *s = sp;
                    const double lp = loss(c);
                    *s = sm;
                    const double lm = loss(c);
                    *s = s0;
                    const double fd = (lp - lm) / (static_cast<double>(sp) - static_cast<double>(sm));
                    // step 1e-3: the O(h²) term of the central difference is ~1e-7 here
                    EXPECT_NEAR(at(r.dsinks, hh), fd, 2e-6 + 1e-5 * std::abs(fd)) << "dsinks " << hh << " " << c.desc;
                }
            }
        }
}

// The tiled fp32 backward against the reference: error relative to the largest reference
// gradient, the budget of test_backward.cpp (2e-5: √n·ε growth of fp32 sums); softcap adds
// the tanh_f32 error c·1.5e-7 = 4e-7 to each score, within it.
TEST(ModifierGrads, TiledMatchesReferenceEveryRowAndThreadCount) {
    constexpr double kTol = 2e-5;
    std::mt19937_64 rng(42);
    const std::int64_t shapes[][6] = {{1, 1, 1, 1, 1, 8}, {2, 2, 3, 7, 65, 16}, {1, 2, 1, 64, 64, 32},
                                      {1, 1, 2, 70, 130, 24}, {2, 1, 1, 33, 20, 8}};
    double worst = 0;
    for (const detail::KernelSet* ks : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*ks);
        for (const auto& s : shapes)
            for (int mask = 0; mask < 5; ++mask)
                for (int mods = 1; mods < 8; ++mods) {
                    Case c = make_case(rng, DType::f32, s[0], s[1], s[2], s[3], s[4], s[5], mask, mods);
                    const AllGrads ref = backward(c, Impl::reference, DType::f64);
                    omp_set_num_threads(1);
                    const AllGrads g1 = backward(c, Impl::flash, DType::f32);
                    omp_set_num_threads(2);
                    const AllGrads g2 = backward(c, Impl::flash, DType::f32);
                    const std::string what = c.desc + " isa=" + detail::isa_name(ks->isa);
                    double den = std::max({max_abs(ref.g.dq), max_abs(ref.g.dk), max_abs(ref.g.dv)});
                    if (c.opt.sinks) den = std::max(den, max_abs(ref.dsinks));
                    for (auto [g, r, name] : {std::tuple{&g1.g.dq, &ref.g.dq, "dq"}, std::tuple{&g1.g.dk, &ref.g.dk, "dk"},
                                              std::tuple{&g1.g.dv, &ref.g.dv, "dv"}, std::tuple{&g1.dsinks, &ref.dsinks, "dsinks"}}) {
                        if (std::string(name) == "dsinks" && !c.opt.sinks) continue;
                        const double e = max_abs_diff(*g, *r) / (den + 1e-30);
                        worst = std::max(worst, e);
                        EXPECT_LE(e, kTol) << name << " " << what;
                    }
                    EXPECT_TRUE(bit_equal(g1.g.dq, g2.g.dq) && bit_equal(g1.g.dk, g2.g.dk) && bit_equal(g1.g.dv, g2.g.dv))
                        << "thread count changed the result: " << what;
                    if (c.opt.sinks) {
                        EXPECT_TRUE(bit_equal(g1.dsinks, g2.dsinks)) << what;
                    }
                }
    }
    omp_set_num_threads(2);
    std::printf("[ info ] tiled backward with modifiers: worst relative error %.3g (tolerance %.0e)\n", worst, kTol);
}

TEST(ModifierGrads, DsinksArgumentErrors) {
    std::mt19937_64 rng(43);
    Case c = make_case(rng, DType::f32, 1, 1, 2, 3, 4, 8, 0, 0);
    const AllGrads r = backward(c, Impl::flash, DType::f32);
    Tensor ds = poisoned(DType::f32, Shape{2});
    TensorView dsv = ds;
    Tensor dq(DType::f32, c.q.shape()), dk(DType::f32, c.k.shape()), dv(DType::f32, c.v.shape());
    try {
        sdpa_backward(c.q, c.k, c.v, r.g.out, r.g.lse, c.dO, c.opt, dq, dk, dv, nullptr, &dsv);
        ADD_FAILURE() << "dsinks without sinks accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("dsinks: given but options.sinks is not set"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(still_poisoned(ds));
}

}  // namespace
}  // namespace attn::test
