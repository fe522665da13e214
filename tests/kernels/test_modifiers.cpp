// Score modifiers (softcap, ALiBi, sinks; docs/conventions.md "Score modifiers").
//
// 1. The reference (the oracle) against constructions that do not share its code:
//    - softcap: a naive loop here, c·tanh(scale·q·k) → softmax → ·V, in double;
//    - ALiBi: the reference with an additive mask −m_h·|d_b(i) − j| that this test builds;
//    - sinks: the reference without sinks on Lk + 1 keys, the extra key having K = 0, V = 0
//      and an additive mask σ_h (its score is then exactly σ_h and its value 0).
// 2. Flash (every kernel table row, 1 and 2 threads, bit-identical) and the decode kernel
//    (every row, with and without split chunks) against the reference on random cases: every
//    modifier alone and combined, with every mask kind, GQA, Lq ≠ Lk, key lengths, windows.
// 3. tanh_f32 (the kernels' tanh) against std::tanh on a dense sweep, per ISA row.
//
// Tolerance of a fast kernel against the reference, from float32 rounding (u = 2^-24),
// worst case over the case (first order, as in test_flash.cpp):
//   score error  E = (Dk+2)·u·scale·max_ij Σ_d|q_id k_jd|   fp32 dot product
//                  + c·(1.5e-7 + 4u)                        softcap: tanh_f32 error (measured
//                                                           bound, test 3) and c·t rounding
//                  + 4u·max_h m_h·(Lq + Lk + |offset|)      ALiBi: distance·slope, subtraction
//                  + 8u·(max|s| + max|mask|)                scale, mask add, − max
//   out  |ΔO| ≤ (2E + (Lk+16)u)·max|V|,   lse |Δlse| ≤ E + (Lk+16)u + u·max|lse|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "attn/reference.hpp"
#include "attn/sdpa.hpp"
#include "common/util.hpp"
#include "kernels/decode/decode.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "kernels/scores.hpp"
#include "sdpa/problem.hpp"

namespace attn {
namespace {

using test::at;
using test::poisoned;
constexpr double kU = 1.0 / 16777216.0;

struct Inputs {
    Tensor q, k, v, bool_mask, add_mask, key_lengths, slopes, sinks;
    SdpaOptions opt;
    std::string desc;
};

// A random case; `kind` picks the mask, the modifiers are drawn.
Inputs random_case(std::mt19937_64& rng, int kind, bool short_q) {
    auto pick = [&](std::initializer_list<std::int64_t> xs) {
        std::vector<std::int64_t> v(xs);
        return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
    };
    const std::int64_t B = pick({1, 2}), Hkv = pick({1, 2}), G = pick({1, 3}), Hq = Hkv * G;
    const std::int64_t Lq = short_q ? pick({1, 2, 5}) : pick({1, 7, 33, 70});
    const std::int64_t Lk = pick({1, 8, 64, 100, 130}), Dk = pick({8, 17, 64}), Dv = pick({8, 16, 33});
    Inputs in;
    in.q = test::randn(DType::f32, Shape{B, Hq, Lq, Dk}, rng);
    in.k = test::randn(DType::f32, Shape{B, Hkv, Lk, Dk}, rng);
    in.v = test::randn(DType::f32, Shape{B, Hkv, Lk, Dv}, rng);
    SdpaOptions& o = in.opt;
    in.desc = "B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
              " Lq=" + std::to_string(Lq) + " Lk=" + std::to_string(Lk) + " Dk=" + std::to_string(Dk) +
              " Dv=" + std::to_string(Dv) + " mask=" + std::to_string(kind);
    switch (kind) {
        case 0: break;
        case 1: o.causal = Causal::top_left; break;
        case 2: o.causal = Causal::bottom_right; break;
        case 3: o.window = Window{pick({0, 3, 20}), pick({-1, 0, 5}), Align::bottom_right}; break;
        case 4: {
            in.key_lengths = Tensor(DType::i64, Shape{B});
            for (std::int64_t b = 0; b < B; ++b)
                in.key_lengths.data_as<std::int64_t>()[b] = std::uniform_int_distribution<std::int64_t>(0, Lk)(rng);
            o.key_lengths = in.key_lengths;
            o.causal = Causal::bottom_right;
            break;
        }
        case 5:
            in.bool_mask = test::random_bool(Shape{B, 1, Lq, Lk}, rng, 0.7);
            o.bool_mask = in.bool_mask;
            break;
        case 6:
            in.add_mask = test::randn(DType::f32, Shape{1, Hq, Lq, Lk}, rng, 2.0);
            o.additive_mask = in.add_mask;
            break;
        case 7:
            o.query_offset = QueryOffset(pick({-3, 0, 40}));
            o.causal = Causal::top_left;
            o.window = Window{10, -1, Align::top_left};
            break;
    }
    const int mods = std::uniform_int_distribution<int>(1, 7)(rng);  // bit 0 softcap, 1 ALiBi, 2 sinks
    if (mods & 1) {
        o.softcap = static_cast<double>(pick({1, 5, 30}));
        if (o.softcap == 1.0) o.softcap = 0.75;
        in.desc += " softcap=" + std::to_string(o.softcap);
    }
    if (mods & 2) {
        if (pick({0, 1}) == 0) {
            in.slopes = alibi_slopes(Hq);
        } else {
            in.slopes = test::rand_uniform(DType::f32, Shape{B, Hq}, rng, 0.0, 0.5);
        }
        o.alibi_slopes = in.slopes;
        in.desc += " alibi" + in.slopes.shape().str();
    }
    if (mods & 4) {
        in.sinks = test::randn(DType::f32, Shape{Hq}, rng, 2.0);
        o.sinks = in.sinks;
        in.desc += " sinks";
    }
    return in;
}

struct Result {
    Tensor out, lse;
};

Result run_reference(const Inputs& in) {
    const TensorView q = in.q, v = in.v;
    Result r{poisoned(DType::f64, Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)}),
             poisoned(DType::f64, Shape{q.dim(0), q.dim(1), q.dim(2)})};
    SdpaOptions o = in.opt;
    o.impl = Impl::reference;
    TensorView l = r.lse;
    sdpa(in.q, in.k, in.v, o, r.out, &l);
    return r;
}

// The bound of the header for this case.
struct Bound {
    double out = 0, lse = 0;
};
Bound bound_for(const Inputs& in, const Result& ref) {
    const TensorView q = in.q, k = in.k;
    const std::int64_t B = q.dim(0), Hq = q.dim(1), Lq = q.dim(2), Dk = q.dim(3), Lk = k.dim(2), G = Hq / k.dim(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(Dk));
    double dot_abs = 0, s_abs = 0;
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < Lq; ++i)
                for (std::int64_t j = 0; j < Lk; ++j) {
                    double a = 0, s = 0;
                    for (std::int64_t d = 0; d < Dk; ++d) {
                        a += std::abs(at(q, b, h, i, d) * at(k, b, h / G, j, d));
                        s += at(q, b, h, i, d) * at(k, b, h / G, j, d);
                    }
                    dot_abs = std::max(dot_abs, a);
                    s_abs = std::max(s_abs, std::abs(s) * scale);
                }
    double E = static_cast<double>(Dk + 2) * kU * scale * dot_abs + 8 * kU * s_abs;
    if (in.opt.softcap > 0) E += in.opt.softcap * (1.5e-7 + 4 * kU);
    if (in.opt.alibi_slopes) {
        double mmax = 0;
        test::for_each_offset(in.slopes, [&](std::int64_t o) { mmax = std::max(mmax, test::load(in.slopes, o)); });
        const double reach = static_cast<double>(Lq + Lk + 64);
        E += 4 * kU * mmax * reach + 8 * kU * mmax * reach;  // the distance term is part of |s| too
    }
    if (in.opt.additive_mask) E += 8 * kU * test::max_abs(in.add_mask);
    double lse_abs = 0;
    test::for_each_offset(ref.lse, [&](std::int64_t o) {
        const double x = test::load(ref.lse, o);
        if (std::isfinite(x)) lse_abs = std::max(lse_abs, std::abs(x));
    });
    const double n = static_cast<double>(Lk + 16);
    return Bound{(2 * E + n * kU) * test::max_abs(in.v) + 1e-30, E + n * kU + kU * lse_abs};
}

// ---- 1. the reference against independent constructions ---------------------------------

TEST(ModifiersReference, SoftcapMatchesNaiveLoop) {
    std::mt19937_64 rng(11);
    for (double c : {0.5, 3.0, 50.0}) {
        const std::int64_t B = 2, H = 3, Lq = 6, Lk = 9, D = 5;
        Tensor q = test::randn(DType::f64, Shape{B, H, Lq, D}, rng, 2.0), k = test::randn(DType::f64, Shape{B, H, Lk, D}, rng, 2.0);
        Tensor v = test::randn(DType::f64, Shape{B, H, Lk, D}, rng);
        SdpaOptions o;
        o.softcap = c;
        o.impl = Impl::reference;
        Tensor out = poisoned(DType::f64, Shape{B, H, Lq, D}), want(DType::f64, Shape{B, H, Lq, D});
        sdpa(q, k, v, o, out);
        const double scale = 1.0 / std::sqrt(5.0);
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t i = 0; i < Lq; ++i) {
                    std::vector<double> e(Lk);
                    double z = 0;
                    for (std::int64_t j = 0; j < Lk; ++j) {
                        double s = 0;
                        for (std::int64_t d = 0; d < D; ++d) s += at(q, b, h, i, d) * at(k, b, h, j, d);
                        e[j] = std::exp(c * std::tanh(s * scale / c));  // |s| <= c: no overflow
                        z += e[j];
                    }
                    for (std::int64_t d = 0; d < D; ++d) {
                        double acc = 0;
                        for (std::int64_t j = 0; j < Lk; ++j) acc += e[j] / z * at(v, b, h, j, d);
                        want.data_as<double>()[want.view().offset(b, h, i, d)] = acc;
                    }
                }
        EXPECT_TRUE(test::all_close(out, want, 1e-14, 1e-12)) << "softcap " << c;
    }
}

TEST(ModifiersReference, AlibiEqualsAdditiveBiasFromBottomRightDiagonal) {
    std::mt19937_64 rng(12);
    const std::int64_t B = 2, H = 3, Lq = 5, Lk = 11, D = 4;
    Tensor q = test::randn(DType::f32, Shape{B, H, Lq, D}, rng), k = test::randn(DType::f32, Shape{B, H, Lk, D}, rng);
    Tensor v = test::randn(DType::f32, Shape{B, H, Lk, D}, rng);
    Tensor slopes = test::rand_uniform(DType::f32, Shape{B, H}, rng, 0.0, 1.0);
    Tensor kl(DType::i32, Shape{B});
    kl.data_as<std::int32_t>()[0] = 11;
    kl.data_as<std::int32_t>()[1] = 7;
    for (int with_offset = 0; with_offset < 2; ++with_offset) {
        Tensor bias(DType::f64, Shape{B, H, Lq, Lk});
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t i = 0; i < Lq; ++i)
                    for (std::int64_t j = 0; j < Lk; ++j) {
                        // d_b(i): bottom-right per sequence (n_b − Lq), or the explicit offset 2
                        const std::int64_t d = i + (with_offset ? 2 : kl.data_as<std::int32_t>()[b] - Lq);
                        bias.data_as<double>()[bias.view().offset(b, h, i, j)] =
                            -static_cast<double>(at(slopes, b, h)) * static_cast<double>(std::abs(d - j));
                    }
        SdpaOptions base;
        base.impl = Impl::reference;
        base.key_lengths = kl;
        base.causal = Causal::bottom_right;
        if (with_offset) base.query_offset = QueryOffset(2);
        SdpaOptions a = base, m = base;
        a.alibi_slopes = slopes;
        m.additive_mask = bias;
        Tensor o1 = poisoned(DType::f64, Shape{B, H, Lq, D}), o2 = poisoned(DType::f64, Shape{B, H, Lq, D});
        sdpa(q, k, v, a, o1);
        sdpa(q, k, v, m, o2);
        EXPECT_TRUE(test::all_close(o1, o2, 1e-15, 1e-13)) << "offset " << with_offset;
    }
}

TEST(ModifiersReference, SinkEqualsExtraKeyWithZeroValue) {
    std::mt19937_64 rng(13);
    const std::int64_t B = 2, H = 4, Hkv = 2, Lq = 6, Lk = 9, D = 5;
    Tensor q = test::randn(DType::f32, Shape{B, H, Lq, D}, rng), k = test::randn(DType::f32, Shape{B, Hkv, Lk, D}, rng);
    Tensor v = test::randn(DType::f32, Shape{B, Hkv, Lk, D}, rng), sinks = test::randn(DType::f32, Shape{H}, rng, 2.0);
    Tensor bm = test::random_bool(Shape{B, H, Lq, Lk}, rng, 0.5);
    for (std::int64_t i = 0; i < Lk; ++i) bm.data_as<bool>()[bm.view().offset(0, 1, 2, i)] = false;  // a row with no key
    Tensor k2(DType::f32, Shape{B, Hkv, Lk + 1, D}, true), v2(DType::f32, Shape{B, Hkv, Lk + 1, D}, true);
    Tensor bias(DType::f32, Shape{B, H, Lq, Lk + 1}, true), bm2(DType::boolean, Shape{B, H, Lq, Lk + 1});
    test::for_each_index(k.shape(), [&](const test::Index& x) {
        test::store(k2, k2.view().offset(x[0], x[1], x[2], x[3]), at(k, x[0], x[1], x[2], x[3]));
        test::store(v2, v2.view().offset(x[0], x[1], x[2], x[3]), at(v, x[0], x[1], x[2], x[3]));
    });
    test::for_each_index(bias.shape(), [&](const test::Index& x) {
        const bool sink = x[3] == Lk;
        bias.data_as<float>()[bias.view().offset(x[0], x[1], x[2], x[3])] = sink ? sinks.data_as<float>()[x[1]] : 0.0f;
        bm2.data_as<bool>()[bm2.view().offset(x[0], x[1], x[2], x[3])] =
            sink || bm.data_as<bool>()[bm.view().offset(x[0], x[1], x[2], x[3])];
    });
    SdpaOptions a, e;
    a.impl = e.impl = Impl::reference;
    a.sinks = sinks;
    a.bool_mask = bm;
    e.additive_mask = bias;
    e.bool_mask = bm2;
    Tensor o1 = poisoned(DType::f64, Shape{B, H, Lq, D}), o2 = poisoned(DType::f64, Shape{B, H, Lq, D});
    Tensor l1 = poisoned(DType::f64, Shape{B, H, Lq}), l2 = poisoned(DType::f64, Shape{B, H, Lq});
    TensorView lv1 = l1, lv2 = l2;
    sdpa(q, k, v, a, o1, &lv1);
    sdpa(q, k2, v2, e, o2, &lv2);
    EXPECT_TRUE(test::all_close(o1, o2, 1e-15, 1e-13));
    EXPECT_TRUE(test::all_close(l1, l2, 1e-15, 1e-13));
    // the row with no key: all mass on the sink
    EXPECT_EQ(at(o1, 0, 1, 2, 0), 0.0);
    EXPECT_EQ(at(l1, 0, 1, 2), static_cast<double>(sinks.data_as<float>()[1]));
}

TEST(ModifiersReference, StandardAlibiSlopes) {
    // The ALiBi paper's get_slopes, written out: 8 heads 2^-1..2^-8; 6 heads: 4 heads'
    // 2^-2, 2^-4, 2^-6, 2^-8, then 8 heads' odd ones 2^-1, 2^-3.
    const Tensor s8 = alibi_slopes(8), s6 = alibi_slopes(6), s1 = alibi_slopes(1);
    for (int h = 0; h < 8; ++h) EXPECT_EQ(s8.data_as<float>()[h], std::ldexp(1.0f, -(h + 1)));
    const float want6[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    for (int h = 0; h < 6; ++h) EXPECT_EQ(s6.data_as<float>()[h], want6[h]) << h;
    EXPECT_EQ(s1.data_as<float>()[0], std::ldexp(1.0f, -8));
    EXPECT_THROW(alibi_slopes(0), Error);
}

// ---- 2. fast kernels against the reference -----------------------------------------------

void expect_close(const Result& got, const Result& ref, const Bound& bd, const std::string& what) {
    EXPECT_TRUE(test::all_close(got.out, ref.out, bd.out, 0)) << what;
    EXPECT_TRUE(test::all_close(got.lse, ref.lse, bd.lse, 0)) << what;
}

TEST(ModifiersKernels, FlashMatchesReferenceEveryRowAndThreadCount) {
    std::mt19937_64 rng(21);
    int cases = 0;
    for (int rep = 0; rep < 10; ++rep)
        for (int kind = 0; kind < 8; ++kind) {
            const Inputs in = random_case(rng, kind, false);
            const Result ref = run_reference(in);
            const Bound bd = bound_for(in, ref);
            // The default tiles, then each task's keys in 3 chunks (the merge adds the sink once),
            // then query blocks of 16 in groups of 3 (each task's own sink and rows).
            const detail::FlashTiles split{64, 16, 3}, grouped{16, 16, 0, 3};
            for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
            for (const detail::FlashTiles* tiles : {static_cast<const detail::FlashTiles*>(nullptr), &split, &grouped}) {
                Result first;
                for (int threads : {1, 2}) {
                    const TensorView q = in.q, v = in.v;
                    Result r{poisoned(DType::f32, Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)}),
                             poisoned(DType::f32, Shape{q.dim(0), q.dim(1), q.dim(2)})};
                    TensorView l = r.lse;
                    const detail::SdpaProblem p = detail::make_problem(in.q, in.k, in.v, in.opt, r.out, &l, nullptr);
                    detail::flash_forward(p, *ks, threads, tiles);
                    const std::string what = in.desc + " isa=" + detail::isa_name(ks->isa) + " threads=" + std::to_string(threads) +
                                             (tiles == &split ? " key_splits=3" : tiles ? " query_group=3" : "");
                    expect_close(r, ref, bd, what);
                    if (threads == 1) first = std::move(r);
                    else EXPECT_TRUE(test::bit_equal(first.out, r.out) && test::bit_equal(first.lse, r.lse)) << what;
                }
            }
            ++cases;
        }
    EXPECT_EQ(cases, 80);
}

// Query blocks of 96 and 160 (3 and 5 panels of 32): a block's panels two at a call
// (kOpsPanelPairs: qk_modified_pair, pv_pair) and the odd last one alone (qk_modified, pv), each
// call reading the ALiBi slopes and distances of its own columns; several heads share a block
// when Lq < Mb. Key blocks of 40 and 64 (a ragged last one).
TEST(ModifiersKernels, FlashOddPanelCountsMatchReference) {
    std::mt19937_64 rng(2212);
    int cases = 0;
    for (int rep = 0; rep < 3; ++rep)
        for (int kind = 0; kind < 8; ++kind) {
            const Inputs in = random_case(rng, kind, false);
            const Result ref = run_reference(in);
            const Bound bd = bound_for(in, ref);
            for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
                for (const detail::FlashTiles tiles : {detail::FlashTiles{96, 40}, detail::FlashTiles{160, 64}}) {
                    const TensorView q = in.q, v = in.v;
                    Result r{poisoned(DType::f32, Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)}),
                             poisoned(DType::f32, Shape{q.dim(0), q.dim(1), q.dim(2)})};
                    TensorView l = r.lse;
                    const detail::SdpaProblem p = detail::make_problem(in.q, in.k, in.v, in.opt, r.out, &l, nullptr);
                    detail::flash_forward(p, *ks, 2, &tiles);
                    expect_close(r, ref, bd, in.desc + " isa=" + detail::isa_name(ks->isa) + " Mb=" + std::to_string(tiles.Mb));
                }
            ++cases;
        }
    EXPECT_EQ(cases, 24);
}

TEST(ModifiersKernels, DecodeMatchesReferenceEveryRowAndSplit) {
    std::mt19937_64 rng(22);
    for (int rep = 0; rep < 8; ++rep)
        for (int kind = 0; kind < 8; ++kind) {
            const Inputs in = random_case(rng, kind, true);
            const Result ref = run_reference(in);
            const Bound bd = bound_for(in, ref);
            for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
                for (std::int64_t split : {0, 1, 3}) {
                    const TensorView q = in.q, v = in.v;
                    Result r{poisoned(DType::f32, Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)}),
                             poisoned(DType::f32, Shape{q.dim(0), q.dim(1), q.dim(2)})};
                    TensorView l = r.lse;
                    const detail::SdpaProblem p = detail::make_problem(in.q, in.k, in.v, in.opt, r.out, &l, nullptr);
                    ASSERT_EQ(detail::decode_declines(p), "") << in.desc;
                    detail::decode_forward(p, *ks, split);
                    expect_close(r, ref, bd, in.desc + " isa=" + detail::isa_name(ks->isa) + " split=" + std::to_string(split));
                }
        }
}

// Tiles that every query sees completely skip the mask rule; with softcap/ALiBi they must
// still get the modifiers (a 64-multiple shape with no mask has only such tiles).
TEST(ModifiersKernels, FullyVisibleTilesGetTheModifiers) {
    std::mt19937_64 rng(23);
    Inputs in;
    in.q = test::randn(DType::f32, Shape{1, 2, 128, 32}, rng, 3.0);
    in.k = test::randn(DType::f32, Shape{1, 2, 128, 32}, rng, 3.0);
    in.v = test::randn(DType::f32, Shape{1, 2, 128, 32}, rng);
    in.slopes = alibi_slopes(2);
    in.opt.softcap = 2.0;
    in.opt.alibi_slopes = in.slopes;
    const Result ref = run_reference(in);
    const Bound bd = bound_for(in, ref);
    for (const detail::KernelSet* ks : detail::runnable_kernel_sets()) {
        Result r{poisoned(DType::f32, Shape{1, 2, 128, 32}), poisoned(DType::f32, Shape{1, 2, 128})};
        TensorView l = r.lse;
        detail::flash_forward(detail::make_problem(in.q, in.k, in.v, in.opt, r.out, &l, nullptr), *ks, 1);
        expect_close(r, ref, bd, detail::isa_name(ks->isa));
    }
}

// The decode kernel skips the mask rule on blocks a row sees completely and then applies
// only the modifiers (decode_core.hpp block_modifiers): no mask, non-causal, keys over several
// blocks and a ragged last one, every row, with and without a key split.
TEST(ModifiersKernels, DecodeFullyVisibleBlocksGetTheModifiers) {
    std::mt19937_64 rng(24);
    for (int mods = 0; mods < 3; ++mods) {
        Inputs in;
        in.q = test::randn(DType::f32, Shape{1, 4, 3, 32}, rng, 3.0);
        in.k = test::randn(DType::f32, Shape{1, 2, 200, 32}, rng, 3.0);
        in.v = test::randn(DType::f32, Shape{1, 2, 200, 32}, rng);
        in.slopes = alibi_slopes(4);
        if (mods != 1) in.opt.softcap = 2.0;
        if (mods != 0) in.opt.alibi_slopes = in.slopes;
        const Result ref = run_reference(in);
        const Bound bd = bound_for(in, ref);
        for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
            for (std::int64_t split : {1, 3}) {
                Result r{poisoned(DType::f32, Shape{1, 4, 3, 32}), poisoned(DType::f32, Shape{1, 4, 3})};
                TensorView l = r.lse;
                const detail::SdpaProblem p = detail::make_problem(in.q, in.k, in.v, in.opt, r.out, &l, nullptr);
                ASSERT_EQ(detail::decode_declines(p), "");
                detail::decode_forward(p, *ks, split);
                expect_close(r, ref, bd, std::string(detail::isa_name(ks->isa)) + " mods=" + std::to_string(mods) +
                                             " split=" + std::to_string(split));
            }
    }
}

// Steep ALiBi slopes (0.3 to 2 per key) walk each 256-key block's weights from 1 down past
// 2^-126: the decode kernel gives a weight below 2^-64 of the row's running max weight 0
// (decode_core.hpp, kWeightFloor: weights in [2^-126, 2^-100] made P·V's FMAs subnormal).
// Every row, with and without a key split, MHA and a GQA group of 4 (the group tiles), sinks
// on and off, three blocks (the last ragged), head dims with an edge: within the header's
// bound of the reference, which keeps every weight. The case must hold keys whose reference
// weight lies between 2^-126 and 2^-64 of their row's largest, or it would not test the floor.
TEST(ModifiersKernels, DecodeSteepAlibiWeightsUnderTheFloor) {
    std::mt19937_64 rng(25);
    constexpr std::int64_t Hq = 4, Lk = 600, Dk = 40, Dv = 33;
    const float steep[Hq] = {0.3f, 0.5f, 0.84f, 2.0f};
    double worst = 0, worst_out = 0;
    int runs = 0;
    for (std::int64_t Hkv : {4, 1})
        for (bool sinks : {false, true}) {
            Inputs in;
            in.q = test::randn(DType::f32, Shape{1, Hq, 1, Dk}, rng);
            in.k = test::randn(DType::f32, Shape{1, Hkv, Lk, Dk}, rng);
            in.v = test::randn(DType::f32, Shape{1, Hkv, Lk, Dv}, rng);
            in.slopes = Tensor(DType::f32, Shape{Hq});
            for (std::int64_t h = 0; h < Hq; ++h) in.slopes.data_as<float>()[h] = steep[h];
            in.opt.causal = Causal::bottom_right;
            in.opt.alibi_slopes = in.slopes;
            if (sinks) {
                in.sinks = test::randn(DType::f32, Shape{Hq}, rng, 2.0);
                in.opt.sinks = in.sinks;
            }
            // Keys with a reference weight in [2^-126, 2^-64) of their row's largest (scores in double).
            std::int64_t under = 0;
            const double scale = 1.0 / std::sqrt(static_cast<double>(Dk));
            for (std::int64_t h = 0; h < Hq; ++h) {
                std::vector<double> sc(Lk);
                for (std::int64_t j = 0; j < Lk; ++j) {
                    double dot = 0;
                    for (std::int64_t d = 0; d < Dk; ++d) dot += at(in.q, 0, h, 0, d) * at(in.k, 0, h / (Hq / Hkv), j, d);
                    sc[j] = scale * dot - steep[h] * static_cast<double>(Lk - 1 - j);
                }
                const double top = *std::max_element(sc.begin(), sc.end());
                for (double x : sc) under += (x - top) / std::log(2.0) >= -126 && (x - top) / std::log(2.0) < -64;
            }
            ASSERT_GT(under, 16) << "Hkv=" << Hkv;
            const Result ref = run_reference(in);
            const Bound bd = bound_for(in, ref);
            for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
                for (std::int64_t split : {1, 3}) {
                    Result r{poisoned(DType::f32, Shape{1, Hq, 1, Dv}), poisoned(DType::f32, Shape{1, Hq, 1})};
                    TensorView l = r.lse;
                    const detail::SdpaProblem p = detail::make_problem(in.q, in.k, in.v, in.opt, r.out, &l, nullptr);
                    ASSERT_EQ(detail::decode_declines(p), "");
                    detail::decode_forward(p, *ks, split);
                    expect_close(r, ref, bd, std::string(detail::isa_name(ks->isa)) + " Hkv=" + std::to_string(Hkv) +
                                                 " sinks=" + std::to_string(sinks) + " split=" + std::to_string(split));
                    const double out_err = test::max_abs_diff(r.out, ref.out);
                    worst = std::max({worst, out_err / bd.out, test::max_abs_diff(r.lse, ref.lse) / bd.lse});
                    worst_out = std::max(worst_out, out_err);
                    ++runs;
                }
        }
    std::printf("[modifiers] steep ALiBi decode: %d runs, max |out err| %.3g, worst err/bound %.3g\n", runs, worst_out, worst);
}

// The scores output at each stage: flash (every row) against the reference; masked keys are
// −inf in both; bound E of the header on every finite score (the reference's are exact).
TEST(ModifiersKernels, FlashScoresOutputMatchesReference) {
    std::mt19937_64 rng(24);
    for (int rep = 0; rep < 3; ++rep)
        for (int kind = 0; kind < 8; ++kind) {
            const Inputs in = random_case(rng, kind, false);
            const Result ref = run_reference(in);
            const Bound bd = bound_for(in, ref);
            const TensorView q = in.q, k = in.k;
            const Shape ss{q.dim(0), q.dim(1), q.dim(2), k.dim(2)};
            for (ScoreStage st : {ScoreStage::scaled, ScoreStage::softcapped, ScoreStage::masked}) {
                Tensor want = poisoned(DType::f64, ss), dummy(DType::f64, Shape{q.dim(0), q.dim(1), q.dim(2), in.v.shape()[3]});
                SdpaOptions o = in.opt;
                o.impl = Impl::reference;
                const ScoresOutput wso{want, st};
                sdpa(in.q, in.k, in.v, o, dummy, nullptr, nullptr, nullptr, &wso);
                // The default tiles, a forced key split (the merge stores the scores from a fresh Qᵀ
                // pack), and groups of query blocks.
                const detail::FlashTiles split{64, 16, 3}, grouped{16, 16, 0, 3};
                for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
                for (const detail::FlashTiles* tiles : {static_cast<const detail::FlashTiles*>(nullptr), &split, &grouped}) {
                    Tensor got = poisoned(DType::f32, ss), out = poisoned(DType::f32, dummy.shape());
                    detail::SdpaProblem p = detail::make_problem(in.q, in.k, in.v, in.opt, out, nullptr, nullptr);
                    detail::attach_scores(p, ScoresOutput{got, st});
                    detail::flash_forward(p, *ks, 2, tiles);
                    // the score bound E is bd.lse minus the (Lk+16)u and u·|lse| terms: use bd.lse, which contains it
                    EXPECT_TRUE(test::all_close(got, want, bd.lse, 0))
                        << in.desc << " stage=" << score_stage_name(st) << " isa=" << detail::isa_name(ks->isa)
                        << (tiles == &split ? " key_splits=3" : tiles ? " query_group=3" : "");
                }
            }
        }
}

// The softcap under a negative scale and a scale/c too large for float32 (the AVX-512 micro-kernel
// folds 2·log2 e·|scale|/c into one factor and takes tanh's oddness for the sign; a factor that
// overflows must not turn a zero score into 0·inf = NaN). Scores at stage masked (the
// micro-kernel's store) and softcapped (the tile pass) on every row against c·tanh(scale·q·k/c)
// in double; per score the bound is c·(1.5e-7 + 4u) + the fp32 dot product's error (|tanh'| <= 1).
// Query row 0 is zero: its scores are exactly 0, whatever the scale.
TEST(ModifiersKernels, FlashSoftcapNegativeAndHugeScale) {
    std::mt19937_64 rng(41);
    const std::int64_t Lq = 5, Lk = 40, Dk = 16;
    Tensor q = test::randn(DType::f32, Shape{1, 1, Lq, Dk}, rng), k = test::randn(DType::f32, Shape{1, 1, Lk, Dk}, rng);
    Tensor v = test::randn(DType::f32, Shape{1, 1, Lk, 8}, rng);
    for (std::int64_t d = 0; d < Dk; ++d) q.data_as<float>()[d] = 0.0f;
    const TensorView qv = q, kv = k;
    for (auto [scale, c] : {std::pair{-0.6, 2.0}, std::pair{-0.6, 0.01}, std::pair{1e35, 1e-6}, std::pair{-1e35, 1e-6}}) {
        SdpaOptions o;
        o.scale = scale;
        o.softcap = c;
        for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
            for (ScoreStage st : {ScoreStage::softcapped, ScoreStage::masked}) {
                Tensor got = poisoned(DType::f32, Shape{1, 1, Lq, Lk}), out = poisoned(DType::f32, Shape{1, 1, Lq, 8});
                detail::SdpaProblem p = detail::make_problem(q, k, v, o, out, nullptr, nullptr);
                detail::attach_scores(p, ScoresOutput{got, st});
                detail::flash_forward(p, *ks, 1);
                const std::string where = std::string(detail::isa_name(ks->isa)) + " stage=" +
                                          std::string(score_stage_name(st)) + " scale=" + std::to_string(scale) +
                                          " c=" + std::to_string(c);
                for (std::int64_t i = 0; i < Lq; ++i)
                    for (std::int64_t j = 0; j < Lk; ++j) {
                        double dot = 0, dot_abs = 0;
                        for (std::int64_t d = 0; d < Dk; ++d) {
                            dot += at(qv, 0, 0, i, d) * at(kv, 0, 0, j, d);
                            dot_abs += std::abs(at(qv, 0, 0, i, d) * at(kv, 0, 0, j, d));
                        }
                        const double want = c * std::tanh(scale * dot / c);
                        const double tol = c * (1.5e-7 + 4 * kU) + (Dk + 4) * kU * std::abs(scale) * dot_abs;
                        const double g = got.data_as<float>()[i * Lk + j];
                        EXPECT_LE(std::abs(g - want), tol) << where << " i=" << i << " j=" << j << " got " << g;
                    }
                for (std::int64_t e = 0; e < Lq * 8; ++e) EXPECT_TRUE(std::isfinite(out.data_as<float>()[e])) << where;
            }
    }
}

// ---- 3. tanh_f32 ---------------------------------------------------------------------------

// Bound of tanh_f32: absolute error <= 1.5e-7, relative <= 1e-6 (measured 8.9e-8 and 2.4e-7
// for E/(E + 2), E = e^{2|x|} − 1: about 1.5 ulp of 1 near |x| = 1.4, a few ulp of tanh at small |x|). The portable copy here is the one every
// kernel's translation unit compiles (an inline function of scores.hpp over exp2.hpp).
TEST(ModifiersTanh, ErrorOnDenseSweep) {
    double max_abs = 0, max_rel = 0;
    for (double x = -20.0; x <= 20.0; x += 1.0 / 4096) {
        for (double y : {x, x * 1e-3, x * 1e-6}) {
            const float xf = static_cast<float>(y);
            const double want = std::tanh(static_cast<double>(xf));
            const double got = detail::tanh_f32(xf);
            max_abs = std::max(max_abs, std::abs(got - want));
            if (want != 0) max_rel = std::max(max_rel, std::abs(got - want) / std::abs(want));
        }
    }
    EXPECT_LE(max_abs, 1.5e-7);
    EXPECT_LE(max_rel, 1e-6);
    EXPECT_EQ(detail::tanh_f32(std::numeric_limits<float>::infinity()), 1.0f);
    EXPECT_EQ(detail::tanh_f32(-std::numeric_limits<float>::infinity()), -1.0f);
    EXPECT_TRUE(std::isnan(detail::tanh_f32(std::numeric_limits<float>::quiet_NaN())));
    std::printf("tanh_f32: max abs error %.3g, max rel error %.3g\n", max_abs, max_rel);
}

// The same bound for the tanh each ISA row's flash kernel compiles (the AVX-512 one replaces
// the division by rcp14 and a correction FMA, and its micro-kernel folds scale/c into tanh's argument): Dk = 1, q = 1, scale 1 and c = 1 make the score of
// key j exactly k[j], so the scores output is that row's tanh of k[j]. Stage softcapped is the
// tile pass; stage masked (no mask) is the step the AVX-512 micro-kernel applies in its store.
TEST(ModifiersTanh, EveryIsaRowErrorOnDenseSweep) {
    std::vector<float> xs;
    for (double x = -20.0; x <= 20.0; x += 1.0 / 1024)
        for (double y : {x, x * 1e-3, x * 1e-6}) xs.push_back(static_cast<float>(y));
    xs.push_back(std::numeric_limits<float>::infinity());
    xs.push_back(-std::numeric_limits<float>::infinity());
    const std::int64_t Lk = static_cast<std::int64_t>(xs.size());
    Tensor q(DType::f32, Shape{1, 1, 1, 1}), k(DType::f32, Shape{1, 1, Lk, 1}), v(DType::f32, Shape{1, 1, Lk, 1}, true);
    q.data_as<float>()[0] = 1.0f;
    std::copy(xs.begin(), xs.end(), k.data_as<float>());
    SdpaOptions o;
    o.scale = 1.0;
    o.softcap = 1.0;
    for (const detail::KernelSet* ks : detail::runnable_kernel_sets())
        for (ScoreStage st : {ScoreStage::softcapped, ScoreStage::masked}) {
            Tensor got = poisoned(DType::f32, Shape{1, 1, 1, Lk}), out = poisoned(DType::f32, Shape{1, 1, 1, 1});
            detail::SdpaProblem p = detail::make_problem(q, k, v, o, out, nullptr, nullptr);
            detail::attach_scores(p, ScoresOutput{got, st});
            detail::flash_forward(p, *ks, 1);
            double max_abs = 0, max_rel = 0;
            const float* g = got.data_as<float>();
            for (std::int64_t j = 0; j + 2 < Lk; ++j) {
                const double want = std::tanh(static_cast<double>(xs[j]));
                max_abs = std::max(max_abs, std::abs(g[j] - want));
                if (want != 0) max_rel = std::max(max_rel, std::abs(g[j] - want) / std::abs(want));
            }
            const std::string where = std::string(detail::isa_name(ks->isa)) + " stage=" + std::string(score_stage_name(st));
            EXPECT_LE(max_abs, 1.5e-7) << where;
            EXPECT_LE(max_rel, 1e-6) << where;
            EXPECT_EQ(g[Lk - 2], 1.0f) << where;
            EXPECT_EQ(g[Lk - 1], -1.0f) << where;
            std::printf("tanh %s: max abs error %.3g, max rel error %.3g\n", where.c_str(), max_abs, max_rel);
        }
}

// ---- errors -------------------------------------------------------------------------------

TEST(ModifiersErrors, BadArgumentsAreRefusedBeforeWriting) {
    std::mt19937_64 rng(31);
    Tensor q = test::randn(DType::f32, Shape{2, 4, 3, 8}, rng), k = test::randn(DType::f32, Shape{2, 2, 5, 8}, rng);
    Tensor v = test::randn(DType::f32, Shape{2, 2, 5, 8}, rng);
    Tensor out = poisoned(DType::f32, Shape{2, 4, 3, 8});
    auto expect_error = [&](const SdpaOptions& o, const std::string& needle) {
        try {
            sdpa(q, k, v, o, out);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
        EXPECT_TRUE(test::still_poisoned(out)) << needle;
    };
    SdpaOptions o;
    o.softcap = -1;
    expect_error(o, "softcap: must be 0 (off) or a finite float32");
    o.softcap = std::numeric_limits<double>::infinity();
    expect_error(o, "softcap");
    o.softcap = 1e39;
    expect_error(o, "softcap");
    o.softcap = 0;
    Tensor s3(DType::f32, Shape{3}, true);
    o.alibi_slopes = s3;
    expect_error(o, "alibi_slopes: shape must be (Hq,) = (4,) or (B, Hq) = (2, 4) but got (3,)");
    Tensor s64(DType::f64, Shape{4}, true);
    o.alibi_slopes = s64;
    expect_error(o, "alibi_slopes: dtype must be float32 but got float64");
    Tensor snan(DType::f32, Shape{2, 4}, true);
    snan.data_as<float>()[5] = std::nanf("");
    o.alibi_slopes = snan;
    expect_error(o, "alibi_slopes: values must be finite but entry (1, 1) is nan");
    o.alibi_slopes.reset();
    Tensor sk(DType::f32, Shape{2}, true);
    o.sinks = sk;
    expect_error(o, "sinks: shape must be (Hq,) = (4,) but got (2,)");
    Tensor sinf(DType::f32, Shape{4}, true);
    sinf.data_as<float>()[3] = -std::numeric_limits<float>::infinity();
    o.sinks = sinf;
    expect_error(o, "sinks: values must be finite but entry 3 is -inf");
}

}  // namespace
}  // namespace attn
