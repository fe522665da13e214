// attn/sdpa.hpp semantics through attn::sdpa with the reference kernel: every mask kind and
// their combinations, GQA/MQA, Dk ≠ Dv, scales, fully masked rows, non-finite inputs, strided
// inputs and outputs. The expected values come from naive_attention.hpp, with each mask rule
// written out below as a predicate from the documented semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "attn/reference.hpp"
#include "attn/sdpa.hpp"
#include "naive_attention.hpp"

namespace {

using namespace attn_test;
using attn::Align;
using attn::Causal;
using attn::Impl;
using attn::SdpaOptions;

struct Outputs {
    Tensor out, lse, weights;
};

// q: (B, Hq, Lq, Dk), k: (B, Hkv, Lk, Dk), v: (B, Hkv, Lk, Dv) → poisoned float64 outputs, then sdpa.
Outputs run_sdpa(const TensorView& q, const TensorView& k, const TensorView& v, SdpaOptions opt,
                 DType out_dtype = DType::f64) {
    const std::int64_t B = q.dim(0), Hq = q.dim(1), Lq = q.dim(2), Lk = k.dim(2), Dv = v.dim(3);
    Outputs o{Tensor(out_dtype, Shape{B, Hq, Lq, Dv}), Tensor(out_dtype, Shape{B, Hq, Lq}),
              Tensor(out_dtype, Shape{B, Hq, Lq, Lk})};
    poison(o.out);
    poison(o.lse);
    poison(o.weights);
    opt.impl = Impl::reference;
    const TensorView lse = o.lse.view(), w = o.weights.view();
    attn::SdpaReport report;
    attn::sdpa(q, k, v, opt, o.out, &lse, &w, &report);
    EXPECT_EQ(report.kernel, "reference");
    return o;
}

// Element n of a contiguous float32/float64 tensor.
double flat(const Tensor& t, std::int64_t n) {
    return t.dtype() == DType::f32 ? static_cast<double>(t.data_as<float>()[n]) : t.data_as<double>()[n];
}

// Every element of out, lse and weights against the naive result: |got − want| ≤ tol·(1 + |want|),
// exact equality for infinities, and masked weights (want == 0 because keep() was false) exactly 0.
void expect_matches(const Outputs& got, const NaiveResult& want, double tol, const std::string& what) {
    int failures = 0;
    auto check = [&](double g, double w, const char* name, std::int64_t idx) {
        const bool ok = std::isinf(w) ? g == w : (!std::isnan(g) && std::fabs(g - w) <= tol * (1.0 + std::fabs(w)));
        if (!ok && failures++ < 8) ADD_FAILURE() << what << ": " << name << "[" << idx << "] = " << g << ", expected " << w;
    };
    for (std::int64_t n = 0; n < got.out.numel(); ++n) check(flat(got.out, n), want.out[static_cast<std::size_t>(n)], "out", n);
    for (std::int64_t n = 0; n < got.lse.numel(); ++n) check(flat(got.lse, n), want.lse[static_cast<std::size_t>(n)], "lse", n);
    for (std::int64_t n = 0; n < got.weights.numel(); ++n) {
        const double g = flat(got.weights, n);
        const double w = want.weights[static_cast<std::size_t>(n)];
        if (w == 0.0) {
            if (g != 0.0 && failures++ < 8) ADD_FAILURE() << what << ": masked weight[" << n << "] = " << g << ", expected exactly 0";
        } else {
            check(g, w, "weights", n);
        }
    }
}

constexpr double kTol64 = 1e-12;  // float64 inputs and outputs, double accumulation on both sides

struct Dims {
    std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
};

struct Inputs {
    Tensor q, k, v;
};

Inputs make_inputs(const Dims& d, std::uint32_t seed, DType dtype = DType::f64) {
    return {random_tensor(dtype, Shape{d.B, d.Hq, d.Lq, d.Dk}, seed, -2, 2),
            random_tensor(dtype, Shape{d.B, d.Hkv, d.Lk, d.Dk}, seed + 1, -2, 2),
            random_tensor(dtype, Shape{d.B, d.Hkv, d.Lk, d.Dv}, seed + 2, -1, 1)};
}

double default_scale(const Dims& d) { return 1.0 / std::sqrt(static_cast<double>(d.Dk)); }

// ---- no mask, shapes, scale ----------------------------------------------------------------

TEST(SdpaNoMask, OddShapesCrossAttentionDkNeDv) {
    for (const Dims d : {Dims{1, 1, 1, 1, 1, 1, 1}, Dims{2, 3, 3, 7, 13, 5, 9}, Dims{1, 2, 2, 17, 3, 33, 1},
                         Dims{3, 1, 1, 5, 65, 8, 2}}) {
        const Inputs in = make_inputs(d, 11);
        const Outputs got = run_sdpa(in.q, in.k, in.v, {});
        expect_matches(got, naive_attention(in.q, in.k, in.v, default_scale(d)), kTol64, "no mask");
    }
}

TEST(SdpaNoMask, GroupedQueryAndMultiQuery) {
    // Query head h reads KV head h / (Hq / Hkv): consecutive query heads share a KV head.
    for (const Dims d : {Dims{2, 6, 2, 5, 7, 4, 3}, Dims{1, 8, 4, 3, 9, 6, 6}, Dims{2, 5, 1, 4, 6, 3, 7}}) {
        const Inputs in = make_inputs(d, 21);
        const Outputs got = run_sdpa(in.q, in.k, in.v, {});
        expect_matches(got, naive_attention(in.q, in.k, in.v, default_scale(d)), kTol64, "gqa");
    }
}

TEST(SdpaNoMask, CustomScales) {
    const Dims d{2, 2, 1, 6, 11, 7, 5};
    const Inputs in = make_inputs(d, 31);
    for (double s : {0.0, 1.0, -0.75, 3.5, 1e-3}) {
        SdpaOptions opt;
        opt.scale = s;
        expect_matches(run_sdpa(in.q, in.k, in.v, opt), naive_attention(in.q, in.k, in.v, s), kTol64,
                       "scale " + std::to_string(s));
    }
    // Scale 0: every visible key gets the same weight, so out is the mean of V.
    SdpaOptions zero;
    zero.scale = 0.0;
    const Outputs got = run_sdpa(in.q, in.k, in.v, zero);
    EXPECT_NEAR(got.weights.data_as<double>()[0], 1.0 / 11.0, 1e-15);
}

TEST(SdpaNoMask, DefaultScaleIsOneOverSqrtDk) {
    const Dims d{1, 1, 1, 4, 6, 9, 2};
    const Inputs in = make_inputs(d, 41);
    const Outputs got = run_sdpa(in.q, in.k, in.v, {});
    expect_matches(got, naive_attention(in.q, in.k, in.v, 1.0 / 3.0), kTol64, "default scale");
}

TEST(SdpaNoMask, Float32InputsAndOutputs) {
    const Dims d{2, 4, 2, 9, 14, 16, 8};
    const Inputs in = make_inputs(d, 51, DType::f32);
    const Outputs got = run_sdpa(in.q, in.k, in.v, {}, DType::f32);
    // Inputs are exact in both; the only error is the final rounding to float32 (2^-24 relative).
    expect_matches(got, naive_attention(in.q, in.k, in.v, default_scale(d)), 1e-7, "float32");
}

// ---- boolean masks ---------------------------------------------------------------------------

struct BoolCase {
    const char* name;
    Shape shape;
};

TEST(SdpaBoolMask, EveryBroadcastShape) {
    const Dims d{2, 3, 3, 5, 8, 4, 6};
    const Inputs in = make_inputs(d, 61);
    for (const BoolCase& c : {BoolCase{"(B,1,1,Lk)", Shape{2, 1, 1, 8}}, BoolCase{"(B,1,Lq,Lk)", Shape{2, 1, 5, 8}},
                              BoolCase{"(Lq,Lk)", Shape{5, 8}}, BoolCase{"(B,Hq,Lq,Lk)", Shape{2, 3, 5, 8}},
                              BoolCase{"(Lk,)", Shape{8}}, BoolCase{"(1,Hq,1,Lk)", Shape{1, 3, 1, 8}}}) {
        const Tensor m = random_bool(c.shape, 71, 0.6);
        auto keep = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
            return m.data_as<std::uint8_t>()[broadcast_offset(c.shape, b, h, i, j)] != 0;
        };
        SdpaOptions opt;
        opt.bool_mask = m.view();
        expect_matches(run_sdpa(in.q, in.k, in.v, opt), naive_attention(in.q, in.k, in.v, default_scale(d), keep),
                       kTol64, std::string("bool ") + c.name);
    }
}

TEST(SdpaBoolMask, PaddingMaskWithAFullyMaskedSequence) {
    const Dims d{3, 2, 2, 4, 6, 3, 5};
    const Inputs in = make_inputs(d, 81);
    Tensor m(DType::boolean, Shape{3, 1, 1, 6}, true);
    const int valid[3] = {6, 0, 2};  // sequence 1 has no valid key at all
    for (int b = 0; b < 3; ++b)
        for (int j = 0; j < valid[b]; ++j) m.data_as<std::uint8_t>()[b * 6 + j] = 1;
    SdpaOptions opt;
    opt.bool_mask = m.view();
    const Outputs got = run_sdpa(in.q, in.k, in.v, opt);
    auto keep = [&](std::int64_t b, std::int64_t, std::int64_t, std::int64_t j) { return j < valid[b]; };
    expect_matches(got, naive_attention(in.q, in.k, in.v, default_scale(d), keep), kTol64, "padding");
    // Sequence 1: out 0, weights 0, lse −inf, no NaN anywhere.
    for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 4; ++i) {
            EXPECT_EQ(at(got.lse, 1, h, i), -kInf);
            for (std::int64_t x = 0; x < 5; ++x) EXPECT_EQ(at(got.out, 1, h, i, x), 0.0);
            for (std::int64_t j = 0; j < 6; ++j) EXPECT_EQ(at(got.weights, 1, h, i, j), 0.0);
        }
}

// ---- additive masks --------------------------------------------------------------------------

TEST(SdpaAdditiveMask, BiasWithMinusInfinityEntries) {
    const Dims d{2, 2, 1, 6, 9, 5, 4};
    const Inputs in = make_inputs(d, 91);
    for (DType mt : {DType::f32, DType::f64}) {
        for (const Shape s : {Shape{2, 2, 6, 9}, Shape{6, 9}, Shape{2, 1, 1, 9}}) {
            Tensor bias = random_tensor(mt, s, 101, -3, 3);
            // Every third element −inf; row 0 of the first (b, h) entirely −inf (a fully masked row).
            for (std::int64_t n = 0; n < bias.numel(); ++n) {
                const bool minf = n % 3 == 0 || n < 9;
                if (!minf) continue;
                if (mt == DType::f32) bias.data_as<float>()[n] = -std::numeric_limits<float>::infinity();
                else bias.data_as<double>()[n] = -kInf;
            }
            auto b_of = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
                const std::int64_t n = broadcast_offset(s, b, h, i, j);
                return mt == DType::f32 ? static_cast<double>(bias.data_as<float>()[n]) : bias.data_as<double>()[n];
            };
            SdpaOptions opt;
            opt.additive_mask = bias.view();
            const Outputs got = run_sdpa(in.q, in.k, in.v, opt);
            expect_matches(got, naive_attention(in.q, in.k, in.v, default_scale(d), nullptr, b_of), kTol64,
                           "additive " + s.str());
            EXPECT_EQ(at(got.lse, 0, 0, 0), -kInf);
            for (std::int64_t x = 0; x < 4; ++x) EXPECT_EQ(at(got.out, 0, 0, 0, x), 0.0);
        }
    }
}

TEST(SdpaAdditiveMask, CombinedWithBoolMask) {
    const Dims d{1, 2, 2, 7, 7, 4, 4};
    const Inputs in = make_inputs(d, 111);
    const Tensor bias = random_tensor(DType::f64, Shape{7, 7}, 112, -5, 5);
    const Tensor m = random_bool(Shape{1, 2, 7, 7}, 113, 0.5);
    SdpaOptions opt;
    opt.additive_mask = bias.view();
    opt.bool_mask = m.view();
    auto keep = [&](std::int64_t, std::int64_t h, std::int64_t i, std::int64_t j) {
        return m.data_as<std::uint8_t>()[(h * 7 + i) * 7 + j] != 0;
    };
    auto b_of = [&](std::int64_t, std::int64_t, std::int64_t i, std::int64_t j) { return bias.data_as<double>()[i * 7 + j]; };
    expect_matches(run_sdpa(in.q, in.k, in.v, opt), naive_attention(in.q, in.k, in.v, default_scale(d), keep, b_of),
                   kTol64, "bool + additive");
}

// ---- causal ----------------------------------------------------------------------------------

// Top-left: query i sees keys 0..i.  Bottom-right: keys 0..i + Lk − Lq (no key lengths here:
// every sequence has n = Lk keys).
TEST(SdpaCausal, BothAlignmentsWithLqBelowEqualAndAboveLk) {
    for (const auto& [lq, lk] : {std::pair<std::int64_t, std::int64_t>{4, 11}, {7, 7}, {11, 4}, {1, 9}, {9, 1}}) {
        const Dims d{2, 2, 1, lq, lk, 5, 3};
        const Inputs in = make_inputs(d, 121);
        SdpaOptions tl;
        tl.causal = Causal::top_left;
        expect_matches(run_sdpa(in.q, in.k, in.v, tl),
                       naive_attention(in.q, in.k, in.v, default_scale(d),
                                       [](auto, auto, auto i, auto j) { return j <= i; }),
                       kTol64, "top-left Lq=" + std::to_string(lq) + " Lk=" + std::to_string(lk));
        SdpaOptions br;
        br.causal = Causal::bottom_right;
        const Outputs got = run_sdpa(in.q, in.k, in.v, br);
        expect_matches(got,
                       naive_attention(in.q, in.k, in.v, default_scale(d),
                                       [lq = lq, lk = lk](auto, auto, auto i, auto j) { return j <= i + lk - lq; }),
                       kTol64, "bottom-right Lq=" + std::to_string(lq) + " Lk=" + std::to_string(lk));
        if (lq > lk) {  // the first Lq − Lk queries see nothing: zeros and −inf, never NaN
            EXPECT_EQ(at(got.lse, 0, 0, 0), -kInf);
            EXPECT_EQ(at(got.out, 1, 1, lq - lk - 1, 0), 0.0);
            EXPECT_GT(at(got.weights, 0, 0, lq - lk, 0), 0.0);
        }
    }
}

TEST(SdpaCausal, WithKeyLengthsAndGqa) {
    const Dims d{3, 4, 2, 5, 9, 3, 6};
    const Inputs in = make_inputs(d, 131);
    Tensor len(DType::i64, Shape{3});
    const std::int64_t lens[3] = {9, 0, 4};
    for (int b = 0; b < 3; ++b) len.data_as<std::int64_t>()[b] = lens[b];
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    opt.key_lengths = len.view();
    // Bottom-right aligns per sequence: query i of sequence b sees keys 0..i + lens[b] − Lq, so
    // sequence 2 (4 keys for 5 queries) has a first row with nothing visible.
    const Outputs got = run_sdpa(in.q, in.k, in.v, opt);
    expect_matches(got,
                   naive_attention(in.q, in.k, in.v, default_scale(d),
                                   [&](auto b, auto, auto i, auto j) { return j <= i + lens[b] - 5 && j < lens[b]; }),
                   kTol64, "causal + key lengths");
    EXPECT_EQ(at(got.lse, 2, 3, 0), -kInf);
    EXPECT_GT(at(got.weights, 2, 3, 1, 0), 0.0);
}

// The picture in docs/conventions.md: a padded batch of two sequences, Lq = 3, key lengths 5
// and 7 (Lk = 7), bottom-right causal. Each query's last visible key, drawn by hand:
//   sequence 0 (5 keys): queries 0, 1, 2 see keys 0..2, 0..3, 0..4
//   sequence 1 (7 keys): queries 0, 1, 2 see keys 0..4, 0..5, 0..6
TEST(SdpaCausal, BottomRightIsPerSequenceWithKeyLengths) {
    const Dims d{2, 1, 1, 3, 7, 4, 3};
    const Inputs in = make_inputs(d, 133);
    Tensor len(DType::i32, Shape{2});
    len.data_as<std::int32_t>()[0] = 5;
    len.data_as<std::int32_t>()[1] = 7;
    const std::int64_t last[2][3] = {{2, 3, 4}, {4, 5, 6}};
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    opt.key_lengths = len.view();
    const Outputs got = run_sdpa(in.q, in.k, in.v, opt);
    for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t i = 0; i < 3; ++i)
            for (std::int64_t j = 0; j < 7; ++j) {
                if (j <= last[b][i]) EXPECT_GT(at(got.weights, b, 0, i, j), 0.0) << "b=" << b << " i=" << i << " j=" << j;
                else EXPECT_EQ(at(got.weights, b, 0, i, j), 0.0) << "b=" << b << " i=" << i << " j=" << j;
            }
    // The same problem through an explicit per-sequence query_offset (n_b − Lq = 2 and 4).
    Tensor off(DType::i64, Shape{2});
    off.data_as<std::int64_t>()[0] = 2;
    off.data_as<std::int64_t>()[1] = 4;
    SdpaOptions by_offset;
    by_offset.causal = Causal::top_left;  // with query_offset the alignment no longer matters
    by_offset.key_lengths = len.view();
    by_offset.query_offset = off.view();
    const Outputs same = run_sdpa(in.q, in.k, in.v, by_offset);
    for (std::int64_t n = 0; n < got.out.numel(); ++n) EXPECT_EQ(flat(same.out, n), flat(got.out, n));
    for (std::int64_t n = 0; n < got.weights.numel(); ++n) EXPECT_EQ(flat(same.weights, n), flat(got.weights, n));
}

// ---- key lengths -----------------------------------------------------------------------------

TEST(SdpaKeyLengths, Int32AndInt64IncludingZeroAndFull) {
    const Dims d{4, 2, 1, 3, 7, 4, 2};
    const Inputs in = make_inputs(d, 141);
    const std::int64_t lens[4] = {0, 7, 1, 4};
    for (DType t : {DType::i32, DType::i64}) {
        Tensor len(t, Shape{4});
        for (int b = 0; b < 4; ++b) {
            if (t == DType::i32) len.data_as<std::int32_t>()[b] = static_cast<std::int32_t>(lens[b]);
            else len.data_as<std::int64_t>()[b] = lens[b];
        }
        SdpaOptions opt;
        opt.key_lengths = len.view();
        const Outputs got = run_sdpa(in.q, in.k, in.v, opt);
        expect_matches(got,
                       naive_attention(in.q, in.k, in.v, default_scale(d),
                                       [&](auto b, auto, auto, auto j) { return j < lens[b]; }),
                       kTol64, std::string("key lengths ") + std::string(attn::dtype_name(t)));
        EXPECT_EQ(at(got.lse, 0, 1, 2), -kInf);
        EXPECT_EQ(at(got.out, 0, 1, 2, 1), 0.0);
    }
}

TEST(SdpaKeyLengths, NonFiniteValuesInPaddedKeysDoNotLeak) {
    // A KV cache's slots past the valid length may hold anything (uninitialised memory, NaN):
    // masked keys get exactly zero weight and contribute nothing.
    const Dims d{2, 1, 1, 3, 6, 2, 2};
    Inputs in = make_inputs(d, 151);
    Tensor len(DType::i32, Shape{2});
    len.data_as<std::int32_t>()[0] = 4;
    len.data_as<std::int32_t>()[1] = 6;
    const Inputs clean = make_inputs(d, 151);
    for (std::int64_t j = 4; j < 6; ++j)
        for (std::int64_t x = 0; x < 2; ++x) {
            in.k.data_as<double>()[in.k.view().offset(0, 0, j, x)] = std::numeric_limits<double>::quiet_NaN();
            in.v.data_as<double>()[in.v.view().offset(0, 0, j, x)] = kInf;
        }
    SdpaOptions opt;
    opt.key_lengths = len.view();
    const Outputs got = run_sdpa(in.q, in.k, in.v, opt);
    expect_matches(got,
                   naive_attention(clean.q, clean.k, clean.v, default_scale(d),
                                   [](auto b, auto, auto, auto j) { return j < (b == 0 ? 4 : 6); }),
                   kTol64, "NaN beyond key length");
}

// ---- sliding window --------------------------------------------------------------------------

// Query i sees keys d−left..d+right, d = i (top-left) or i + Lk − Lq (bottom-right, no key
// lengths); −1 = unbounded.
TEST(SdpaWindow, LeftRightBothAlignments) {
    struct W {
        std::int64_t left, right;
    };
    for (const auto& [lq, lk] : {std::pair<std::int64_t, std::int64_t>{6, 10}, {10, 6}, {8, 8}}) {
        const Dims d{1, 2, 2, lq, lk, 4, 3};
        const Inputs in = make_inputs(d, 161);
        for (Align al : {Align::top_left, Align::bottom_right}) {
            for (const W w : {W{2, 0}, W{0, 0}, W{1, 3}, W{-1, 1}, W{3, -1}, W{0, -1}}) {
                SdpaOptions opt;
                opt.window = {w.left, w.right, al};
                auto keep = [&, lq = lq, lk = lk](auto, auto, std::int64_t i, std::int64_t j) {
                    const std::int64_t diag = al == Align::top_left ? i : i + lk - lq;
                    return (w.left < 0 || j >= diag - w.left) && (w.right < 0 || j <= diag + w.right);
                };
                expect_matches(run_sdpa(in.q, in.k, in.v, opt), naive_attention(in.q, in.k, in.v, default_scale(d), keep),
                               kTol64,
                               "window l=" + std::to_string(w.left) + " r=" + std::to_string(w.right) +
                                   (al == Align::top_left ? " top-left" : " bottom-right") + " Lq=" + std::to_string(lq) +
                                   " Lk=" + std::to_string(lk));
            }
        }
    }
}

TEST(SdpaWindow, HugeBoundsMeanUnbounded) {
    // A bound larger than any distance between a query's diagonal and a key excludes nothing,
    // up to the largest int64 (no overflow in d + right + 1 or d − left).
    const std::int64_t big = std::numeric_limits<std::int64_t>::max();
    for (const auto& [lq, lk] : {std::pair<std::int64_t, std::int64_t>{3, 5}, {6, 2}}) {
        const Dims d{1, 1, 1, lq, lk, 4, 3};
        const Inputs in = make_inputs(d, 165);
        const NaiveResult want = naive_attention(in.q, in.k, in.v, default_scale(d));
        for (Align al : {Align::top_left, Align::bottom_right}) {
            for (const auto& [l, r] : {std::pair<std::int64_t, std::int64_t>{big, -1}, {-1, big}, {big, big},
                                       {big - 1, lq + lk}, {lq + lk, big - 7}}) {
                SdpaOptions opt;
                opt.window = {l, r, al};
                expect_matches(run_sdpa(in.q, in.k, in.v, opt), want, kTol64,
                               "window l=" + std::to_string(l) + " r=" + std::to_string(r) +
                                   (al == Align::top_left ? " top-left" : " bottom-right"));
            }
        }
    }
}

TEST(SdpaWindow, CombinedWithCausalBoolAndKeyLengths) {
    const Dims d{2, 3, 1, 9, 12, 5, 4};
    const Inputs in = make_inputs(d, 171);
    const Tensor m = random_bool(Shape{2, 1, 9, 12}, 172, 0.8);
    Tensor len(DType::i32, Shape{2});
    len.data_as<std::int32_t>()[0] = 12;
    len.data_as<std::int32_t>()[1] = 5;
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    opt.window = {3, -1, Align::bottom_right};
    opt.bool_mask = m.view();
    opt.key_lengths = len.view();
    opt.scale = 0.6;
    auto keep = [&](std::int64_t b, auto, std::int64_t i, std::int64_t j) {
        const std::int64_t n = b == 0 ? 12 : 5;
        const std::int64_t diag = i + n - 9;  // per sequence: sequence 1's first 4 rows see nothing
        return j <= diag && j >= diag - 3 && j < n && m.data_as<std::uint8_t>()[(b * 9 + i) * 12 + j] != 0;
    };
    expect_matches(run_sdpa(in.q, in.k, in.v, opt), naive_attention(in.q, in.k, in.v, 0.6, keep), kTol64, "all masks");
}

// ---- alignment sweep: key lengths, query_offset, causal and window together -------------------

// Every combination of causal, window alignment and bounds, with and without key lengths
// (some shorter than Lq), with no query_offset, one offset for all (negative, zero, beyond
// Lk) or one per sequence (int32 and int64), against SequenceRule (naive_attention.hpp).
TEST(SdpaAlignment, KeyLengthsAndQueryOffsetsAgainstTheWrittenRule) {
    const Dims d{3, 2, 1, 4, 9, 3, 2};
    const Inputs in = make_inputs(d, 191);
    const std::int64_t lens[3] = {9, 2, 6};
    const std::int64_t per_seq[3] = {-2, 5, 0};
    Tensor len(DType::i64, Shape{3});
    Tensor off32(DType::i32, Shape{3}), off64(DType::i64, Shape{3});
    for (int b = 0; b < 3; ++b) {
        len.data_as<std::int64_t>()[b] = lens[b];
        off32.data_as<std::int32_t>()[b] = static_cast<std::int32_t>(per_seq[b]);
        off64.data_as<std::int64_t>()[b] = per_seq[b];
    }
    enum class Off { none, minus3, zero, beyond, per_seq32, per_seq64 };
    struct W {
        std::int64_t left, right;
    };
    int cases = 0;
    for (bool with_lengths : {false, true})
        for (Off o : {Off::none, Off::minus3, Off::zero, Off::beyond, Off::per_seq32, Off::per_seq64})
            for (Causal c : {Causal::none, Causal::top_left, Causal::bottom_right})
                for (const W w : {W{-1, -1}, W{1, 0}, W{0, 2}, W{2, -1}})
                    for (Align wa : {Align::top_left, Align::bottom_right}) {
                        if (w.left < 0 && w.right < 0 && wa == Align::bottom_right) continue;  // no window
                        SdpaOptions opt;
                        opt.causal = c;
                        opt.window = {w.left, w.right, wa};
                        if (with_lengths) opt.key_lengths = len.view();
                        if (o == Off::minus3) opt.query_offset = -3;
                        if (o == Off::zero) opt.query_offset = 0;
                        if (o == Off::beyond) opt.query_offset = 11;
                        if (o == Off::per_seq32) opt.query_offset = off32.view();
                        if (o == Off::per_seq64) opt.query_offset = off64.view();
                        auto rule = [&](std::int64_t b) {
                            SequenceRule r{c, opt.window, with_lengths ? lens[b] : d.Lk, d.Lq, std::nullopt};
                            if (o == Off::minus3) r.offset = -3;
                            if (o == Off::zero) r.offset = 0;
                            if (o == Off::beyond) r.offset = 11;
                            if (o == Off::per_seq32 || o == Off::per_seq64) r.offset = per_seq[b];
                            return r;
                        };
                        auto keep = [&](std::int64_t b, auto, std::int64_t i, std::int64_t j) { return rule(b).keep(i, j); };
                        expect_matches(run_sdpa(in.q, in.k, in.v, opt),
                                       naive_attention(in.q, in.k, in.v, default_scale(d), keep), kTol64,
                                       "lengths=" + std::to_string(with_lengths) + " offset#" +
                                           std::to_string(static_cast<int>(o)) + " causal#" +
                                           std::to_string(static_cast<int>(c)) + " window l=" + std::to_string(w.left) +
                                           " r=" + std::to_string(w.right) +
                                           (wa == Align::top_left ? " top-left" : " bottom-right"));
                        ++cases;
                    }
    EXPECT_EQ(cases, 2 * 6 * 3 * 7);
}

// ---- rows with nothing to attend to, non-finite inputs ---------------------------------------

TEST(SdpaFullyMasked, EveryRowMaskedGivesZerosAndMinusInfinity) {
    const Dims d{2, 2, 1, 3, 4, 2, 3};
    const Inputs in = make_inputs(d, 181);
    Tensor m(DType::boolean, Shape{1}, true);  // a single false broadcast everywhere
    SdpaOptions opt;
    opt.bool_mask = m.view();
    for (DType od : {DType::f32, DType::f64}) {
        const Outputs got = run_sdpa(in.q, in.k, in.v, opt, od);
        for (std::int64_t n = 0; n < got.out.numel(); ++n) EXPECT_EQ(flat(got.out, n), 0.0);
        for (std::int64_t n = 0; n < got.weights.numel(); ++n) EXPECT_EQ(flat(got.weights, n), 0.0);
        for (std::int64_t n = 0; n < got.lse.numel(); ++n) EXPECT_EQ(flat(got.lse, n), -kInf);
    }
}

TEST(SdpaNonFinite, NaNAndInfinityInputsPropagateWithoutCrashing) {
    const Dims d{2, 2, 2, 4, 5, 3, 3};
    const double nan = std::numeric_limits<double>::quiet_NaN();
    {  // NaN in Q[0,0,1,*]: that row is NaN everywhere, every other row is untouched.
        Inputs in = make_inputs(d, 191);
        in.q.data_as<double>()[in.q.view().offset(0, 0, 1, 2)] = nan;
        const Outputs got = run_sdpa(in.q, in.k, in.v, {});
        const NaiveResult want = naive_attention(in.q, in.k, in.v, default_scale(d));
        for (std::int64_t x = 0; x < 3; ++x) EXPECT_TRUE(written_nan(at(got.out, 0, 0, 1, x)));
        EXPECT_TRUE(written_nan(at(got.lse, 0, 0, 1)));
        for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t h = 0; h < 2; ++h)
                for (std::int64_t i = 0; i < 4; ++i) {
                    if (b == 0 && h == 0 && i == 1) continue;
                    for (std::int64_t x = 0; x < 3; ++x) EXPECT_NEAR(at(got.out, b, h, i, x), want.o(b, h, i, x), 1e-12);
                }
    }
    {  // +inf in K[1,1,3,0] makes scores ±inf or NaN in query head 1 of batch 1 only (Hq = Hkv here).
        Inputs in = make_inputs(d, 192);
        in.k.data_as<double>()[in.k.view().offset(1, 1, 3, 0)] = kInf;
        const Outputs got = run_sdpa(in.q, in.k, in.v, {});
        const NaiveResult want = naive_attention(in.q, in.k, in.v, default_scale(d));
        for (std::int64_t n = 0; n < 2 * 4 * 3; ++n)  // batch 0 is finite and exact
            EXPECT_NEAR(got.out.data_as<double>()[n], want.out[static_cast<std::size_t>(n)], 1e-12);
        for (std::int64_t i = 0; i < 4; ++i)
            for (std::int64_t x = 0; x < 3; ++x) EXPECT_NEAR(at(got.out, 1, 0, i, x), want.o(1, 0, i, x), 1e-12);
        for (std::int64_t h = 1; h < 2; ++h)
            for (std::int64_t i = 0; i < 4; ++i) {
                // q·k = +inf·q0: the softmax of a row with +inf is NaN (inf − inf), −inf gives that key weight 0.
                const double q0 = at(in.q, 1, h, i, 0);
                if (q0 < 0) {
                    EXPECT_EQ(at(got.weights, 1, h, i, 3), 0.0);
                    for (std::int64_t x = 0; x < 3; ++x) EXPECT_NEAR(at(got.out, 1, h, i, x), want.o(1, h, i, x), 1e-12);
                } else {
                    EXPECT_TRUE(written_nan(at(got.out, 1, h, i, 0)));
                }
            }
    }
    {  // Infinity in V[0,1,2,1]: every row that gives key 2 weight gets inf in column 1, nothing else changes.
        Inputs in = make_inputs(d, 193);
        in.v.data_as<double>()[in.v.view().offset(0, 1, 2, 1)] = -kInf;
        const Outputs got = run_sdpa(in.q, in.k, in.v, {});
        // Query head h reads KV head h here (Hq = Hkv): head 0 is untouched.
        for (std::int64_t i = 0; i < 4; ++i)
            for (std::int64_t x = 0; x < 3; ++x) EXPECT_TRUE(std::isfinite(at(got.out, 0, 0, i, x)));
        for (std::int64_t i = 0; i < 4; ++i) EXPECT_EQ(at(got.out, 0, 1, i, 1), -kInf);
        for (std::int64_t i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(at(got.out, 0, 1, i, 0)));
    }
}

// ---- strided inputs and outputs --------------------------------------------------------------

TEST(SdpaStrided, BLHDInputsAndASliceOfAKvCacheWithoutCopies) {
    const std::int64_t B = 2, Hq = 4, Hkv = 2, Lq = 5, cap = 20, Lk = 13, D = 6;
    const Tensor q_blhd = random_tensor(DType::f32, Shape{B, Lq, Hq, D}, 201);
    const Tensor k_cache = random_tensor(DType::f32, Shape{B, Hkv, cap, D}, 202);
    const Tensor v_cache = random_tensor(DType::f32, Shape{B, Hkv, cap, D}, 203);
    const TensorView q = q_blhd.view().transpose(1, 2);     // (B, Hq, Lq, D) view of (B, Lq, Hq, D)
    const TensorView k = k_cache.view().slice(2, 3, Lk);     // keys 3..15 of the cache
    const TensorView v = v_cache.view().slice(2, 3, Lk);
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    // The output as a (B, Lq, Hq, D) buffer seen as (B, Hq, Lq, D), inside a bigger poisoned buffer.
    Tensor big(DType::f32, Shape{B, Lq, Hq, D + 3});
    poison(big);
    const TensorView out = big.view().slice(3, 1, D).transpose(1, 2);
    opt.impl = Impl::reference;
    attn::sdpa(q, k, v, opt, out);
    const NaiveResult want =
        naive_attention(q, k, v, 1.0 / std::sqrt(6.0), [&](auto, auto, auto i, auto j) { return j <= i + Lk - Lq; });
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < Lq; ++i)
                for (std::int64_t x = 0; x < D + 3; ++x) {
                    const float got = big.data_as<float>()[big.view().offset(b, i, h, x)];
                    if (x >= 1 && x <= D) {
                        EXPECT_NEAR(got, want.o(b, h, i, x - 1), 1e-7 * (1 + std::fabs(want.o(b, h, i, x - 1))));
                    } else {
                        EXPECT_TRUE(is_poison(got)) << "wrote outside the output view";
                    }
                }
}

TEST(SdpaStrided, TransposedInputGivesTheSameResultAsAContiguousCopy) {
    const Dims d{2, 3, 3, 7, 7, 4, 4};
    const Tensor blhd = random_tensor(DType::f64, Shape{2, 7, 3, 4}, 211);
    const Inputs in = make_inputs(d, 212);
    Tensor copy(DType::f64, Shape{2, 3, 7, 4});
    const TensorView t = blhd.view().transpose(1, 2);
    for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < 3; ++h)
            for (std::int64_t i = 0; i < 7; ++i)
                for (std::int64_t x = 0; x < 4; ++x) copy.data_as<double>()[copy.view().offset(b, h, i, x)] = at(t, b, h, i, x);
    SdpaOptions opt;
    opt.causal = Causal::top_left;
    const Outputs a = run_sdpa(t, in.k, in.v, opt);
    const Outputs c = run_sdpa(copy, in.k, in.v, opt);
    for (std::int64_t n = 0; n < a.out.numel(); ++n) EXPECT_EQ(a.out.data_as<double>()[n], c.out.data_as<double>()[n]);
}

// ---- reference_steps (attn/reference.hpp) ----------------------------------------------------

TEST(ReferenceSteps, IntermediatesMatchTheTextbook) {
    const Dims d{1, 2, 1, 4, 5, 3, 2};
    const Inputs in = make_inputs(d, 221);
    SdpaOptions opt;
    opt.causal = Causal::top_left;
    const attn::AttentionSteps s = attn::reference_steps(in.q, in.k, in.v, opt);
    const NaiveResult want =
        naive_attention(in.q, in.k, in.v, default_scale(d), [](auto, auto, auto i, auto j) { return j <= i; });
    for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 4; ++i) {
            for (std::int64_t j = 0; j < 5; ++j) {
                double dot = 0;
                for (std::int64_t x = 0; x < 3; ++x) dot += at(in.q, 0, h, i, x) * at(in.k, 0, 0, j, x);
                EXPECT_NEAR(at(s.scores, 0, h, i, j), dot * default_scale(d), 1e-13);
                if (j <= i) EXPECT_EQ(at(s.masked_scores, 0, h, i, j), at(s.scores, 0, h, i, j));
                else EXPECT_EQ(at(s.masked_scores, 0, h, i, j), -kInf);
                EXPECT_NEAR(at(s.weights, 0, h, i, j), want.w(0, h, i, j), 1e-13);
            }
            EXPECT_NEAR(at(s.lse, 0, h, i), want.l(0, h, i), 1e-13);
            for (std::int64_t x = 0; x < 2; ++x) EXPECT_NEAR(at(s.out, 0, h, i, x), want.o(0, h, i, x), 1e-13);
        }
}

TEST(ReferenceSteps, SoftcappedStageSitsBetweenScaledAndMasked) {
    // softcapped = c·tanh(scaled / c), computed here from the scaled stage; masked = the
    // softcapped one where visible (no ALiBi, no additive mask), −inf elsewhere.
    const Dims d{1, 2, 1, 4, 5, 3, 2};
    const Inputs in = make_inputs(d, 222);
    SdpaOptions opt;
    opt.causal = Causal::top_left;
    opt.softcap = 0.3;  // small: the inputs' scores reach past it, so the stage differs from S
    const attn::AttentionSteps s = attn::reference_steps(in.q, in.k, in.v, opt);
    ASSERT_EQ(s.softcapped_scores.shape(), s.scores.shape());
    double moved = 0;
    for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 4; ++i)
            for (std::int64_t j = 0; j < 5; ++j) {
                const double sc = at(s.scores, 0, h, i, j), capped = at(s.softcapped_scores, 0, h, i, j);
                EXPECT_NEAR(capped, 0.3 * std::tanh(sc / 0.3), 1e-15);
                moved = std::max(moved, std::fabs(capped - sc));
                if (j <= i) EXPECT_EQ(at(s.masked_scores, 0, h, i, j), capped);
                else EXPECT_EQ(at(s.masked_scores, 0, h, i, j), -kInf);
            }
    EXPECT_GT(moved, 0.01);
    opt.softcap = 0.0;  // off: the stage is S itself
    const attn::AttentionSteps off = attn::reference_steps(in.q, in.k, in.v, opt);
    for (std::int64_t n = 0; n < off.scores.numel(); ++n)
        EXPECT_EQ(off.softcapped_scores.data_as<double>()[n], off.scores.data_as<double>()[n]);
}

// reference_steps keeps one head's buffers for all heads (each head refills them): every head's
// intermediates must be its own, bit for bit the double reference's through attn::sdpa (which
// runs each head in its own thread's buffers) — heads that differ in their KV head (GQA), ALiBi
// slope and sink, with masks that leave rows of different lengths, so a stale row would show.
TEST(ReferenceSteps, EveryHeadBitIdenticalToTheDoubleReference) {
    const Dims d{2, 4, 2, 5, 7, 3, 2};
    const Inputs in = make_inputs(d, 223);
    const Tensor slopes = attn::alibi_slopes(d.Hq);
    const Tensor sinks = random_tensor(DType::f32, Shape{d.Hq}, 224, -1, 1);
    for (const bool dropout : {false, true}) {
        SdpaOptions opt;
        opt.causal = Causal::bottom_right;
        opt.window.left = 3;
        opt.softcap = 0.7;
        opt.alibi_slopes = slopes.view();
        opt.sinks = sinks.view();
        if (dropout) {
            opt.dropout_p = 0.3;
            opt.dropout_seed = 225;
        }
        const attn::AttentionSteps s = attn::reference_steps(in.q, in.k, in.v, opt);
        const Outputs want = run_sdpa(in.q, in.k, in.v, opt);
        auto same_bits = [](const Tensor& got, const Tensor& expected, const char* name, bool dropped) {
            ASSERT_EQ(got.shape(), expected.shape()) << name;
            ASSERT_EQ(got.dtype(), DType::f64) << name;
            for (std::int64_t n = 0; n < got.numel(); ++n) {
                const double g = got.data_as<double>()[n], e = expected.data_as<double>()[n];
                ASSERT_EQ(std::memcmp(&g, &e, sizeof g), 0)
                    << name << "[" << n << "] = " << g << ", the double reference gives " << e << (dropped ? " (dropout)" : "");
            }
        };
        same_bits(s.out, want.out, "out", dropout);
        same_bits(s.lse, want.lse, "lse", dropout);
        same_bits(s.weights, want.weights, "weights", dropout);
        if (dropout) continue;  // sdpa writes no scores with dropout
        for (const auto& [stage, got, name] : {std::tuple{attn::ScoreStage::scaled, &s.scores, "scores"},
                                               std::tuple{attn::ScoreStage::softcapped, &s.softcapped_scores, "softcapped_scores"},
                                               std::tuple{attn::ScoreStage::masked, &s.masked_scores, "masked_scores"}}) {
            Tensor o(DType::f64, Shape{d.B, d.Hq, d.Lq, d.Dv}), sc(DType::f64, Shape{d.B, d.Hq, d.Lq, d.Lk});
            poison(sc);
            SdpaOptions ref = opt;
            ref.impl = Impl::reference;
            const attn::ScoresOutput so{sc.view(), stage};
            attn::sdpa(in.q, in.k, in.v, ref, o, nullptr, nullptr, nullptr, &so);
            same_bits(*got, sc, name, false);
        }
    }
}

}  // namespace
