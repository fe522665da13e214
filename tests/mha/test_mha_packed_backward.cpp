// MultiHeadAttention::forward_packed_train + backward (packed input with cu_seqlens) against
// the batched layer run on each sequence alone (forward_train + backward on (L, 1, E); that
// path is checked against torch autograd by test_mha_backward_torch.py): the packed output
// rows and input-gradient rows must be the sequence's, each parameter gradient the sum over
// the sequences. Also forward_packed (inference) against the same outputs, so the layer's
// score modifiers (sinks, softcap, ALiBi) are applied on the packed path too.
// Budget: float32 rounding of GEMMs that sum over other row blocks (all Tq/Tk rows vs one
// sequence's): 2e-5 of the largest element of each tensor (measured worst printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "mha_test_util.hpp"
#include "varlen/varlen_util.hpp"  // cu_seqlens: the packed layout's offsets
#include "attn/error.hpp"
#include "attn/sdpa_varlen.hpp"

namespace {

using namespace attn;
using attn::mha_test::random_tensor;
using attn::mha_test::message;
using attn::mha_test::randomise;
using attn::test::max_abs;

constexpr double kTol = 2e-5;

// The layer's cu_seqlens, int64.
Tensor cu(const std::vector<std::int64_t>& len) { return test::cu_seqlens(len, DType::i64); }

struct Case {
    std::int64_t E, h, hkv, kdim;
    bool causal, bias, modifiers;
    double dropout;
};

// Rows [t0, t0 + L) of a packed (T, F) tensor as an (L, 1, F) batch of one.
TensorView seq(const TensorView& t, std::int64_t t0, std::int64_t L) {
    const TensorView r = t.slice(0, t0, L);
    return TensorView(r.data(), r.dtype(), Shape{L, 1, r.dim(1)}, Strides{r.stride(0), 0, r.stride(1)});
}

double worst = 0.0;

void expect_close(const char* what, std::int64_t n, const float* got, const float* want, double den) {
    for (std::int64_t i = 0; i < n; ++i) {
        const double d = std::fabs(static_cast<double>(got[i]) - want[i]) / den;
        worst = std::max(worst, d);
        ASSERT_LE(d, kTol) << what << " element " << i << ": " << got[i] << " vs " << want[i];
    }
}

void check(const Case& cs, std::uint32_t seed) {
    std::mt19937 rng(seed);
    MhaConfig mc;
    mc.embed_dim = cs.E;
    mc.num_heads = cs.h;
    mc.num_kv_heads = cs.hkv;
    mc.kdim = mc.vdim = cs.kdim;
    mc.bias = cs.bias;
    if (cs.modifiers) {
        mc.sinks = true;
        mc.softcap = 5.0;
        for (std::int64_t i = 0; i < cs.h; ++i) mc.alibi_slopes.push_back(0.25f / static_cast<float>(i + 1));
    }
    MultiHeadAttention m(mc);
    randomise(m, rng);
    // Lengths include an empty sequence and one of a single token.
    const std::vector<std::int64_t> len = {5, 1, 0, 23, 40, 3};
    const auto N = static_cast<std::int64_t>(len.size());
    std::int64_t T = 0;
    for (auto l : len) T += l;
    const bool self = cs.kdim == cs.E;
    const Tensor x = random_tensor(Shape{T, cs.E}, rng);
    const Tensor kx_own = self ? Tensor() : random_tensor(Shape{T, cs.kdim}, rng);
    const Tensor vx_own = self ? Tensor() : random_tensor(Shape{T, cs.kdim}, rng);
    const TensorView kx = self ? x.view() : kx_own.view(), vx = self ? x.view() : vx_own.view();
    const Tensor dy = random_tensor(Shape{T, cs.E}, rng);
    const Tensor c = cu(len);
    MhaPackedOptions po;
    po.causal = cs.causal ? Causal::top_left : Causal::none;
    const MhaTrainOptions train{cs.dropout, 77 + seed};

    MhaForwardState st;
    const Tensor y = m.forward_packed_train(x, kx, vx, c, c, po, train, st);
    ASSERT_EQ(y.shape(), (Shape{T, cs.E}));
    const MhaGradients g = m.backward(st, dy);
    ASSERT_EQ(g.query.shape(), (Shape{T, cs.E}));
    ASSERT_EQ(g.key.shape(), (Shape{T, cs.kdim}));

    // The oracle: each sequence alone, its gradients summed over the sequences.
    Tensor want_y(DType::f32, Shape{T, cs.E}, true), want_dq(DType::f32, Shape{T, cs.E}, true),
        want_dk(DType::f32, Shape{T, cs.kdim}, true), want_dv(DType::f32, Shape{T, cs.kdim}, true);
    std::map<std::string, std::vector<double>> want_p;
    for (const auto& [name, shape] : m.parameter_shapes()) want_p[name].assign(static_cast<std::size_t>(shape.numel()), 0.0);
    MhaForwardOptions fo;
    fo.need_weights = false;
    fo.causal = cs.causal ? attn::Causal::top_left : attn::Causal::none;
    std::int64_t t0 = 0;
    for (std::int64_t b = 0; b < N; ++b) {
        const std::int64_t L = len[static_cast<std::size_t>(b)];
        if (L == 0) continue;  // no rows; adds nothing to any parameter gradient
        // sdpa_varlen's dropout stream for sequence b, at batch index 0 as in a batch of one.
        const MhaTrainOptions tb{cs.dropout, varlen_dropout_seed(*train.dropout_seed, b)};
        MhaForwardState sb;
        const Tensor yb = m.forward_train(seq(x, t0, L), seq(kx, t0, L), seq(vx, t0, L), fo, tb, sb);
        const MhaGradients gb = m.backward(sb, seq(dy, t0, L));
        std::memcpy(want_y.data_as<float>() + t0 * cs.E, yb.data(), yb.nbytes());
        std::memcpy(want_dq.data_as<float>() + t0 * cs.E, gb.query.data(), gb.query.nbytes());
        std::memcpy(want_dk.data_as<float>() + t0 * cs.kdim, gb.key.data(), gb.key.nbytes());
        std::memcpy(want_dv.data_as<float>() + t0 * cs.kdim, gb.value.data(), gb.value.nbytes());
        for (const auto& [name, t] : gb.params) {
            std::vector<double>& acc = want_p.at(name);
            for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += t.data_as<float>()[i];
        }
        t0 += L;
    }
    if (self) {  // self-attention: the caller's input gradient is the sum of the three
        for (std::int64_t i = 0; i < T * cs.E; ++i) {
            want_dq.data_as<float>()[i] += want_dk.data_as<float>()[i] + want_dv.data_as<float>()[i];
            g.query.data_as<float>()[i] += g.key.data_as<float>()[i] + g.value.data_as<float>()[i];
        }
    }
    expect_close("output", T * cs.E, y.data_as<float>(), want_y.data_as<float>(), max_abs(want_y) + 1e-30);
    expect_close("d query", T * cs.E, g.query.data_as<float>(), want_dq.data_as<float>(), max_abs(want_dq) + 1e-30);
    if (!self) {
        expect_close("d key", T * cs.kdim, g.key.data_as<float>(), want_dk.data_as<float>(), max_abs(want_dk) + 1e-30);
        expect_close("d value", T * cs.kdim, g.value.data_as<float>(), want_dv.data_as<float>(), max_abs(want_dv) + 1e-30);
    }
    ASSERT_EQ(g.params.size(), want_p.size());
    for (const auto& [name, t] : g.params) {
        const std::vector<double>& w = want_p.at(name);
        double den = 1e-30;
        for (double v : w) den = std::max(den, std::fabs(v));
        std::vector<float> wf(w.begin(), w.end());
        SCOPED_TRACE(name);
        expect_close(name.c_str(), t.numel(), t.data_as<float>(), wf.data(), den);
    }
    if (cs.dropout == 0.0) {  // inference: the same rows as the training forward
        const Tensor yi = m.forward_packed(x, kx, vx, c, c, po);
        expect_close("forward_packed", T * cs.E, yi.data_as<float>(), want_y.data_as<float>(), max_abs(want_y) + 1e-30);
    }
}

TEST(MhaPackedBackward, MatchesEachSequenceAlone) {
    const Case cases[] = {
        {32, 4, 4, 32, true, true, false, 0.0},   // self-attention, packed in_proj_weight
        {32, 4, 2, 32, false, true, false, 0.0},  // GQA
        {48, 6, 3, 20, true, false, false, 0.0},  // cross-attention (kdim), no bias
        {16, 2, 1, 16, true, true, true, 0.0},    // sinks + softcap + ALiBi
        {32, 4, 4, 32, true, true, false, 0.3},   // dropout: per-sequence seeds
    };
    std::uint32_t seed = 11;
    for (const Case& c : cases) {
        SCOPED_TRACE("E=" + std::to_string(c.E) + " h=" + std::to_string(c.h) + " hkv=" + std::to_string(c.hkv) +
                     " kdim=" + std::to_string(c.kdim) + " causal=" + std::to_string(c.causal) +
                     " modifiers=" + std::to_string(c.modifiers) + " dropout=" + std::to_string(c.dropout));
        check(c, seed++);
        if (::testing::Test::HasFatalFailure()) return;
    }
    std::printf("worst relative difference: %.3g (budget %.1g)\n", worst, kTol);
}

TEST(MhaPackedBackward, BadStateOrGradIsAClearError) {
    MhaConfig mc;
    mc.embed_dim = 8;
    mc.num_heads = 2;
    MultiHeadAttention m(mc);
    const Tensor x(DType::f32, Shape{6, 8}, true), c = cu({2, 4});
    MhaForwardState st;
    (void)m.forward_packed_train(x, x, x, c, c, {}, {}, st);
    const Tensor wrong(DType::f32, Shape{5, 8}, true);
    EXPECT_NE(message([&] { (void)m.backward(st, wrong); }).find("grad_output: expected a floating tensor shaped like the packed output (6, 8)"),
              std::string::npos)
        << message([&] { (void)m.backward(st, wrong); });
    const Tensor fcu(DType::f32, Shape{3}, true);
    EXPECT_NE(message([&] { (void)m.forward_packed_train(x, x, x, fcu, c, {}, {}, st); })
                  .find("cu_seqlens_q: expected an (N+1,) int32 or int64 tensor but got float32"),
              std::string::npos);
    EXPECT_NE(message([&] { (void)m.forward_packed_train(x, x, x, c, c, {}, {1.0, 0}, st); }).find("dropout_p: must be in [0, 1) but got 1"),
              std::string::npos);
    EXPECT_NE(message([&] { (void)m.forward_packed_train(x, x, x, c, c, {}, MhaTrainOptions{0.5, std::nullopt}, st); })
                  .find("MultiHeadAttention.forward_packed: dropout_seed: dropout_p = 0.5 needs a seed"),
              std::string::npos);
}

}  // namespace
