// Finite differences for the reference backward (double), determinism of the tiled
// backward, fully masked rows, dropout statistics, Philox known answers, argument errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>
#include <functional>
#include <ostream>

#include "attn/error.hpp"
#include "core/dropout.hpp"
#include "core/philox.hpp"
#include "grad_util.hpp"
#include "kernels/backward/backward.hpp"
#include "kernels/backward/tile.hpp"

namespace attn::test {
namespace {

// ---- Philox4x32-10 against Random123's tests/kat_vectors ----
TEST(Philox, KnownAnswerVectors) {
    using detail::philox4x32_10;
    EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (detail::PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
    EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
              (detail::PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
    EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
              (detail::PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// ---- finite differences: the reference backward is the gradient of <O, dO> ----
struct FdCase {
    const char* name;
    std::int64_t Hq, Hkv, Lq, Lk, Dk, Dv;
    Causal causal;
    int mask;  // 0 none, 1 bool, 2 additive with −inf
    double dropout;
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }  // readable ctest names

class FiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(FiniteDifferences, ReferenceBackwardIsTheGradient) {
    const FdCase c = GetParam();
    // Thousands of tiny forwards: one thread avoids OpenMP barriers on a busy machine.
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    std::mt19937_64 rng(42);
    Tensor q = randn(DType::f64, Shape{2, c.Hq, c.Lq, c.Dk}, rng), k = randn(DType::f64, Shape{2, c.Hkv, c.Lk, c.Dk}, rng);
    Tensor v = randn(DType::f64, Shape{2, c.Hkv, c.Lk, c.Dv}, rng), dO = randn(DType::f64, Shape{2, c.Hq, c.Lq, c.Dv}, rng);
    SdpaOptions opt;
    opt.causal = c.causal;
    opt.dropout_p = c.dropout;
    opt.dropout_seed = 1234;
    Tensor mask;
    if (c.mask == 1) {
        mask = Tensor(DType::boolean, Shape{c.Lq, c.Lk});
        for (std::int64_t i = 0; i < mask.numel(); ++i) mask.data_as<bool>()[i] = (i * 7 + 3) % 5 != 0;
        mask.data_as<bool>()[0] = false;  // row 0: (with causal) no visible key at all
        opt.bool_mask = mask.view();
    } else if (c.mask == 2) {
        mask = randn(DType::f64, Shape{2, 1, c.Lq, c.Lk}, rng);
        for (std::int64_t i = 0; i < mask.numel(); i += 4) mask.data_as<double>()[i] = -INFINITY;
        opt.additive_mask = mask.view();
    }
    const Grads g = forward_backward(q, k, v, dO, opt, Impl::reference, DType::f64);
    Tensor o(DType::f64, Shape{2, c.Hq, c.Lq, c.Dv});
    opt.impl = Impl::reference;
    auto loss = [&] {  // <O, dO>
        sdpa(q, k, v, opt, o);
        double s = 0;
        for (std::int64_t i = 0; i < o.numel(); ++i) s += o.data_as<double>()[i] * dO.data_as<double>()[i];
        return s;
    };
    // Central differences: truncation h²·f''' ≈ 1e-10, rounding ε·|loss|/h ≈ 1e-10.
    const double h = 1e-5;
    double worst = 0, largest = 0;
    for (auto [x, dx] : {std::pair{&q, &g.dq}, std::pair{&k, &g.dk}, std::pair{&v, &g.dv}}) {
        for (std::int64_t i = 0; i < x->numel(); ++i) {
            double& xi = x->data_as<double>()[i];
            const double x0 = xi;
            xi = x0 + h;
            const double lp = loss();
            xi = x0 - h;
            const double lm = loss();
            xi = x0;
            const double fd = (lp - lm) / (2 * h), an = dx->data_as<double>()[i];
            worst = test::worse(worst, std::abs(fd - an));
            largest = std::max(largest, std::abs(an));
        }
    }
    omp_set_num_threads(saved_threads);
    std::printf("[ info ] %s: max |fd − analytic| = %.2e, max |grad| = %.2f\n", c.name, worst, largest);
    EXPECT_LE(worst, 1e-7 * std::max(1.0, largest));
    EXPECT_GT(largest, 0.1);  // the check compared real gradients
}

INSTANTIATE_TEST_SUITE_P(
    Grad, FiniteDifferences,
    ::testing::Values(FdCase{"plain", 2, 2, 5, 6, 3, 4, Causal::none, 0, 0.0},
                      FdCase{"gqa_causal_top_left_bool", 4, 2, 6, 4, 5, 2, Causal::top_left, 1, 0.0},
                      FdCase{"causal_bottom_right_additive", 2, 1, 3, 7, 4, 4, Causal::bottom_right, 2, 0.0},
                      FdCase{"dropout_fixed_seed", 2, 2, 5, 6, 3, 4, Causal::none, 0, 0.4},
                      FdCase{"dropout_gqa_causal_bool", 4, 1, 6, 6, 3, 5, Causal::top_left, 1, 0.25}),
    [](const auto& tp) { return std::string(tp.param.name); });

// ---- determinism: bit-identical across repeats and thread counts ----
TEST(FlashBackward, BitIdenticalAcrossThreadCountsAndRuns) {
    struct Shape5 {
        std::int64_t B, Hq, Hkv, Lq, Lk, D;
        Causal causal;
        double p;
    };
    // The second shape has B·Hkv = 1, so key blocks are split into chunks with separate dQ partials.
    for (const Shape5& s : {Shape5{2, 4, 2, 300, 257, 40, Causal::bottom_right, 0.2}, Shape5{1, 3, 1, 200, 700, 64, Causal::none, 0.0}}) {
        std::mt19937_64 rng(7);
        Tensor q = randn(DType::f32, Shape{s.B, s.Hq, s.Lq, s.D}, rng), k = randn(DType::f32, Shape{s.B, s.Hkv, s.Lk, s.D}, rng);
        Tensor v = randn(DType::f32, Shape{s.B, s.Hkv, s.Lk, s.D}, rng), dO = randn(DType::f32, Shape{s.B, s.Hq, s.Lq, s.D}, rng);
        SdpaOptions opt;
        opt.causal = s.causal;
        opt.dropout_p = s.p;
        opt.dropout_seed = 99;
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        const Grads one = forward_backward(q, k, v, dO, opt, Impl::flash);
        for (int threads : {1, 2, 3, 5}) {
            omp_set_num_threads(threads);
            for (int rep = 0; rep < 2; ++rep) {
                const Grads g = forward_backward(q, k, v, dO, opt, Impl::flash);
                EXPECT_TRUE(bit_equal(g.dq, one.dq)) << threads << " threads";
                EXPECT_TRUE(bit_equal(g.dk, one.dk)) << threads << " threads";
                EXPECT_TRUE(bit_equal(g.dv, one.dv)) << threads << " threads";
            }
        }
        omp_set_num_threads(saved);
    }
}

// ---- NaN/±inf in Q or dO read in place ----
// Float32 Q/dO rows of unit stride are read in place; a head holding a NaN/±inf gets a copy
// with those entries 0 for dSᵀ·Q and P̂ᵀ·dO, made by the task for that head alone
// (prepare_rows, query_heads.hpp). Rows of another stride are widened into the task's buffer
// and zeroed there (widen_rows). Both routes see the same values, so they must give the same bits; and
// the heads away from the poisoned ones must give the clean run's bits.
TEST(FlashBackward, InPlaceNonFiniteRowsMatchWidened) {
    const std::int64_t B = 2, Hq = 4, Hkv = 2, Lq = 130, Lk = 100, D = 64;
    std::mt19937_64 rng(31);
    const Tensor q = randn(DType::f32, Shape{B, Hq, Lq, D}, rng), k = randn(DType::f32, Shape{B, Hkv, Lk, D}, rng);
    const Tensor v = randn(DType::f32, Shape{B, Hkv, Lk, D}, rng), dO = randn(DType::f32, Shape{B, Hq, Lq, D}, rng);
    // t's values as every second element of a (B, H, L, 2·D) buffer: the widened route
    const auto spread = [](const Tensor& t, Tensor& buf) {
        const Shape s = t.shape();
        buf = Tensor(DType::f32, Shape{s[0], s[1], s[2], 2 * s[3]}, true);
        for (std::int64_t e = 0; e < t.numel(); ++e) buf.data_as<float>()[2 * e] = t.data_as<const float>()[e];
        const Strides bs = buf.view().strides();
        return TensorView(buf.data(), DType::f32, s, Strides{bs[0], bs[1], bs[2], 2});
    };
    Tensor qn(DType::f32, q.shape()), dOn(DType::f32, dO.shape());
    std::memcpy(qn.data(), q.data(), q.nbytes());
    std::memcpy(dOn.data(), dO.data(), dO.nbytes());
    // batch 1, row 3: a NaN in Q head 1 (KV head 0), an inf in dO head 2 (KV head 1)
    qn.data_as<float>()[qn.view().offset(1, 1, 3, 5)] = std::numeric_limits<float>::quiet_NaN();
    dOn.data_as<float>()[dOn.view().offset(1, 2, 3, 60)] = std::numeric_limits<float>::infinity();
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        SCOPED_TRACE(detail::isa_name(row->isa));
        Tensor qb, db;
        const Grads in_place = forward_backward(qn, k, v, dOn, opt, Impl::flash);
        const Grads widened = forward_backward(spread(qn, qb), k, v, spread(dOn, db), opt, Impl::flash);
        EXPECT_TRUE(bit_equal(in_place.dq, widened.dq)) << "dq";
        EXPECT_TRUE(bit_equal(in_place.dk, widened.dk)) << "dk";
        EXPECT_TRUE(bit_equal(in_place.dv, widened.dv)) << "dv";
        // Row 3 sees no key (bottom-right, Lq − Lk = 30): its P is 0 everywhere, so it adds
        // nothing to any gradient — 0, never 0·NaN or 0·inf, which the copies are there to prevent.
        for (const Tensor* g : {&in_place.dq, &in_place.dk, &in_place.dv})
            for (std::int64_t e = 0; e < g->numel(); ++e) ASSERT_TRUE(std::isfinite(g->data_as<float>()[e])) << e;
        // Batch 0 holds no NaN/inf: its gradients are the clean run's, bit for bit.
        const Grads clean = forward_backward(q, k, v, dO, opt, Impl::flash);
        for (const auto& [got, want, name] : {std::tuple{&in_place.dq, &clean.dq, "dq"}, std::tuple{&in_place.dk, &clean.dk, "dk"},
                                              std::tuple{&in_place.dv, &clean.dv, "dv"}}) {
            const std::size_t half = static_cast<std::size_t>(want->nbytes() / 2);
            EXPECT_EQ(std::memcmp(got->data(), want->data(), half), 0) << name << " of batch 0";
        }
    }
}

// ---- fully masked rows: zero gradient, never NaN ----
TEST(FlashBackward, FullyMaskedRowsGiveZeroGradients) {
    for (Impl impl : {Impl::flash, Impl::reference}) {
        std::mt19937_64 rng(3);
        const std::int64_t B = 2, H = 2, Lq = 70, Lk = 90, D = 16;
        Tensor q = randn(DType::f32, Shape{B, H, Lq, D}, rng), k = randn(DType::f32, Shape{B, H, Lk, D}, rng);
        Tensor v = randn(DType::f32, Shape{B, H, Lk, D}, rng), dO = randn(DType::f32, Shape{B, H, Lq, D}, rng);
        Tensor kl(DType::i32, Shape{B});
        kl.data_as<std::int32_t>()[0] = 0;   // batch 0: no key at all
        kl.data_as<std::int32_t>()[1] = 50;  // batch 1: keys 50.. hidden
        Tensor mask(DType::boolean, Shape{Lq, Lk});
        for (std::int64_t i = 0; i < Lq; ++i)
            for (std::int64_t j = 0; j < Lk; ++j) mask.data_as<bool>()[i * Lk + j] = i % 3 != 0;  // rows 0, 3, … hidden
        SdpaOptions opt;
        opt.key_lengths = kl.view();
        opt.bool_mask = mask.view();
        const Grads g = forward_backward(q, k, v, dO, opt, impl);
        for (std::int64_t h = 0; h < H; ++h) {
            for (std::int64_t i = 0; i < Lq; ++i)
                for (std::int64_t d = 0; d < D; ++d) {
                    const double x0 = at(g.dq, 0, h, i, d), x1 = at(g.dq, 1, h, i, d);
                    ASSERT_EQ(x0, 0.0);
                    if (i % 3 == 0) ASSERT_EQ(x1, 0.0);
                    else ASSERT_TRUE(std::isfinite(x1));
                }
            for (std::int64_t j = 0; j < Lk; ++j)
                for (std::int64_t d = 0; d < D; ++d) {
                    ASSERT_EQ(at(g.dk, 0, h, j, d), 0.0);
                    ASSERT_EQ(at(g.dv, 0, h, j, d), 0.0);
                    if (j >= 50) {
                        ASSERT_EQ(at(g.dk, 1, h, j, d), 0.0);
                        ASSERT_EQ(at(g.dv, 1, h, j, d), 0.0);
                    } else {
                        ASSERT_TRUE(std::isfinite(at(g.dk, 1, h, j, d)));
                    }
                }
        }
    }
}

// ---- dropout ----
TEST(Dropout, KeepRateWithinStatisticalBounds) {
    for (double p : {0.1, 0.5, 0.9}) {
        const detail::Dropout drop(p, 0xC0FFEE);
        std::int64_t kept[4] = {0, 0, 0, 0}, n = 0;
        for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t h = 0; h < 4; ++h)
                for (std::int64_t i = 0; i < 256; ++i)
                    for (std::int64_t j = 0; j < 512; ++j, ++n) kept[j % 4] += drop.keep(b, h, i, j);
        // Each of the four Philox output words, and their total, within 5σ of 1 − p.
        const double total = static_cast<double>(kept[0] + kept[1] + kept[2] + kept[3]);
        const double sd = std::sqrt(p * (1 - p) / static_cast<double>(n));
        EXPECT_NEAR(total / static_cast<double>(n), 1 - p, 5 * sd) << "p=" << p;
        for (int w = 0; w < 4; ++w) EXPECT_NEAR(static_cast<double>(kept[w]) / (n / 4.0), 1 - p, 10 * sd) << "word " << w;
    }
}

// The tiles' row generators (vectorised Philox in the AVX2 one) against Dropout::factor.
TEST(Dropout, RowGeneratorsMatchTheDefinition) {
    std::mt19937_64 rng(11);
    for (int rep = 0; rep < 200; ++rep) {
        const double p = std::uniform_real_distribution<double>(0.0, 0.95)(rng);
        const std::uint64_t seed = rng();
        const detail::Dropout drop(p, seed);
        const std::uint32_t b = rng() % 4, h = rng() % 40, i = static_cast<std::uint32_t>(rng() % 100000),
                            j4 = static_cast<std::uint32_t>(rng() % 100000);
        const int n4 = 1 + static_cast<int>(rng() % 21);
        std::vector<float> want(static_cast<std::size_t>(4 * n4));
        for (int k = 0; k < 4 * n4; ++k) want[static_cast<std::size_t>(k)] = static_cast<float>(drop.factor(b, h, i, 4 * j4 + k)) ;
        for (const detail::KernelSet* k : detail::runnable_kernel_sets()) {
            std::vector<float> got(want.size(), -1.0f);
            k->dropout_row({drop.key[0], drop.key[1], drop.threshold, static_cast<float>(drop.scale), b, h, i, j4, n4, got.data()});
            ASSERT_EQ(got, want) << "p=" << p << " n4=" << n4;
        }
    }
}

TEST(Dropout, MeanOutputOverSeedsIsTheUndroppedOutput) {
    std::mt19937_64 rng(5);
    const std::int64_t Lq = 4, Lk = 16, D = 3;
    Tensor q = randn(DType::f64, Shape{1, 2, Lq, D}, rng), k = randn(DType::f64, Shape{1, 2, Lk, D}, rng);
    Tensor v = randn(DType::f64, Shape{1, 2, Lk, D}, rng);
    SdpaOptions opt;
    opt.impl = Impl::reference;
    Tensor o0(DType::f64, Shape{1, 2, Lq, D}), o(DType::f64, Shape{1, 2, Lq, D});
    sdpa(q, k, v, opt, o0);
    opt.dropout_p = 0.3;
    const int S = 2000;
    std::vector<double> sum(static_cast<std::size_t>(o.numel()), 0.0), sq(sum.size(), 0.0);
    for (int s = 0; s < S; ++s) {
        opt.dropout_seed = static_cast<std::uint64_t>(s) * 0x9E3779B97F4A7C15ull;
        sdpa(q, k, v, opt, o);
        for (std::size_t e = 0; e < sum.size(); ++e) {
            sum[e] += o.data_as<double>()[e];
            sq[e] += o.data_as<double>()[e] * o.data_as<double>()[e];
        }
    }
    for (std::size_t e = 0; e < sum.size(); ++e) {
        const double mean = sum[e] / S, sd = std::sqrt(std::max(0.0, sq[e] / S - mean * mean));
        EXPECT_NEAR(mean, o0.data_as<double>()[e], 5 * sd / std::sqrt(static_cast<double>(S)) + 1e-12) << e;
    }
}

TEST(Dropout, ZeroProbabilityIsExactlyNoDropout) {
    std::mt19937_64 rng(6);
    Tensor q = randn(DType::f32, Shape{1, 2, 70, 24}, rng), k = randn(DType::f32, Shape{1, 2, 90, 24}, rng);
    Tensor v = randn(DType::f32, Shape{1, 2, 90, 24}, rng), dO = randn(DType::f32, Shape{1, 2, 70, 24}, rng);
    for (Impl impl : {Impl::flash, Impl::reference}) {
        SdpaOptions a, b;
        b.dropout_p = 0.0;
        b.dropout_seed = 12345;
        const Grads ga = forward_backward(q, k, v, dO, a, impl), gb = forward_backward(q, k, v, dO, b, impl);
        EXPECT_TRUE(bit_equal(ga.out, gb.out));
        EXPECT_TRUE(bit_equal(ga.dq, gb.dq) && bit_equal(ga.dk, gb.dk) && bit_equal(ga.dv, gb.dv));
    }
}

TEST(Dropout, SameSeedSameResultOtherSeedOtherResult) {
    std::mt19937_64 rng(8);
    Tensor q = randn(DType::f32, Shape{1, 1, 33, 16}, rng), k = randn(DType::f32, Shape{1, 1, 40, 16}, rng);
    Tensor v = randn(DType::f32, Shape{1, 1, 40, 16}, rng), dO = randn(DType::f32, Shape{1, 1, 33, 16}, rng);
    SdpaOptions opt;
    opt.dropout_p = 0.5;
    opt.dropout_seed = 1;
    const Grads a = forward_backward(q, k, v, dO, opt, Impl::flash), b = forward_backward(q, k, v, dO, opt, Impl::flash);
    EXPECT_TRUE(bit_equal(a.out, b.out) && bit_equal(a.dq, b.dq) && bit_equal(a.dk, b.dk) && bit_equal(a.dv, b.dv));
    opt.dropout_seed = 2;
    const Grads c = forward_backward(q, k, v, dO, opt, Impl::flash);
    EXPECT_FALSE(bit_equal(a.out, c.out));
    EXPECT_FALSE(bit_equal(a.dv, c.dv));
}

// ---- argument errors: named, and nothing written ----
TEST(SdpaBackwardErrors, NameTheArgumentAndWriteNothing) {
    std::mt19937_64 rng(9);
    Tensor q = randn(DType::f32, Shape{1, 2, 5, 4}, rng), k = randn(DType::f32, Shape{1, 2, 6, 4}, rng);
    Tensor v = randn(DType::f32, Shape{1, 2, 6, 3}, rng), o = randn(DType::f32, Shape{1, 2, 5, 3}, rng);
    Tensor lse = randn(DType::f32, Shape{1, 2, 5}, rng), dO = randn(DType::f32, Shape{1, 2, 5, 3}, rng);
    Tensor dq = poisoned(DType::f32, q.shape()), dk = poisoned(DType::f32, k.shape()), dv = poisoned(DType::f32, v.shape());
    Tensor bad_lse = randn(DType::f32, Shape{1, 2, 6}, rng), bad_dO = randn(DType::f32, Shape{1, 2, 5, 4}, rng);
    Tensor bad_dk = poisoned(DType::f32, Shape{1, 2, 6, 3});
    Tensor bool_dO(DType::boolean, Shape{1, 2, 5, 3});
    auto expect_error = [&](const std::function<void()>& f, const std::string& msg) {
        try {
            f();
            ADD_FAILURE() << "no error, expected: " << msg;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
        }
        for (const Tensor* t : {&dq, &dk, &dv})
            for (std::int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isnan(t->data_as<float>()[i])) << msg;
    };
    SdpaOptions opt;
    expect_error([&] { sdpa_backward(q, k, v, o, bad_lse, dO, opt, dq, dk, dv); },
                 "lse: expected shape (B, Hq, Lq) = (1, 2, 5) but got (1, 2, 6)");
    expect_error([&] { sdpa_backward(q, k, v, o, lse, bad_dO, opt, dq, dk, dv); },
                 "grad_out: expected the shape of out (1, 2, 5, 3) but got (1, 2, 5, 4)");
    expect_error([&] { sdpa_backward(q, k, v, o, lse, bool_dO, opt, dq, dk, dv); },
                 "grad_out: dtype must be float32, float64, float16 or bfloat16 but got bool");
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, opt, dq, bad_dk, dv); },
                 "dk: expected the shape of k (1, 2, 6, 4) but got (1, 2, 6, 3)");
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, opt, dq, dk, dO.view().slice(2, 0, 5).transpose(0, 0)); },
                 "dv: expected the shape of v");
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, opt, q, dk, dv); }, "dq: must not share memory with q");
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, opt, dq, dk, dk.view().slice(3, 0, 3)); },
                 "dk: must not share memory with dv");
    SdpaOptions masked = opt;  // the option tensors are inputs too
    masked.additive_mask = dq.view().slice(3, 0, 1);  // (1, 2, 5, 1), broadcast over the keys: inside dq
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, masked, dq, dk, dv); },
                 "sdpa_backward: dq: must not share memory with additive_mask");
    Tensor one_row = poisoned(DType::f32, Shape{1, 2, 1, 4});
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, opt, one_row.view().broadcast_to(q.shape(), "dq"), dk, dv); },
                 "sdpa_backward: dq: dimension 2 has stride 0 but size 5; an output cannot be a broadcast view");
    SdpaOptions bad = opt;
    bad.dropout_p = 1.0;
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, bad, dq, dk, dv); }, "dropout_p: must be in [0, 1) but got 1");
    bad = opt;  // the backward regenerates the forward's mask: without the forward's seed it has none
    bad.dropout_p = 0.25;
    bad.dropout_seed.reset();
    expect_error([&] { sdpa_backward(q, k, v, o, lse, dO, bad, dq, dk, dv); },
                 "sdpa_backward: dropout_seed: dropout_p = 0.25 needs a seed");
    Tensor q64 = randn(DType::f64, q.shape(), rng);
    bad = opt;
    bad.impl = Impl::flash;
    expect_error([&] { sdpa_backward(q64, k, v, o, lse, dO, bad, dq, dk, dv); }, "flash backward cannot run this call: it needs q, k, v, out and grad_out in float32, float16 or bfloat16 and a float32 lse");
}

// out, lse and grad_out are the backward's inputs: a broadcast view of them is read as any input
// is (the same bits as contiguous copies). sdpa_backward refused out and lse as if they were
// outputs ("out: dimension 1 has stride 0 but size 2; an output cannot be a broadcast view");
// its gradients still may not share memory with them.
TEST(SdpaBackwardErrors, ReadBroadcastOutAndLseAsInputs) {
    std::mt19937_64 rng(12);
    const Shape s{1, 2, 8, 8};
    const Tensor q = randn(DType::f32, s, rng), k = randn(DType::f32, s, rng), v = randn(DType::f32, s, rng);
    Tensor one_out = randn(DType::f32, Shape{1, 1, 1, 8}, rng), one_lse = randn(DType::f32, Shape{1, 1, 1}, rng);
    const Tensor one_dO = randn(DType::f32, Shape{1, 1, 1, 8}, rng);
    const TensorView out = one_out.view().broadcast_to(s, "out"), lse = one_lse.view().broadcast_to(Shape{1, 2, 8}, "lse");
    const TensorView dO = one_dO.view().broadcast_to(s, "grad_out");
    const Tensor out_c = to_dtype(out, DType::f32), lse_c = to_dtype(lse, DType::f32), dO_c = to_dtype(dO, DType::f32);
    for (const Impl impl : {Impl::flash, Impl::reference}) {
        SdpaOptions opt;
        opt.impl = impl;
        opt.causal = Causal::top_left;
        const Tensor dq(DType::f32, s), dk(DType::f32, s), dv(DType::f32, s);
        const Tensor dq_c(DType::f32, s), dk_c(DType::f32, s), dv_c(DType::f32, s);
        sdpa_backward(q, k, v, out, lse, dO, opt, dq, dk, dv);
        sdpa_backward(q, k, v, out_c, lse_c, dO_c, opt, dq_c, dk_c, dv_c);
        EXPECT_TRUE(bit_equal(dq, dq_c) && bit_equal(dk, dk_c) && bit_equal(dv, dv_c)) << impl_name(impl);
    }
    // A gradient over the memory of a broadcast input is still refused: writing dq would change
    // the out it reads.
    const Tensor dq(DType::f32, s), dk(DType::f32, s), dv(DType::f32, s);
    const TensorView out_in_dq = dq.view().slice(1, 0, 1).slice(2, 0, 1).broadcast_to(s, "out");
    try {
        sdpa_backward(q, k, v, out_in_dq, lse, dO, SdpaOptions{}, dq, dk, dv);
        ADD_FAILURE() << "a dq holding out was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sdpa_backward: dq: must not share memory with out"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace attn::test
