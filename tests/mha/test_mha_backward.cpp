// MultiHeadAttention::forward_train / backward against central finite differences of the
// layer itself, in the cases torch cannot check (dropout: torch's RNG differs; grouped-
// query heads; add_zero_attn with bias_k) — tests/mha/test_mha_backward_torch.py compares
// with torch autograd for the rest.
//
// The layer computes in float32, so the finite differences are of a float32 function:
// loss = Σ output·R summed in double, step eps = 1e-2 (central). Truncation O(eps²) and
// the float32 rounding of the loss (~1e-6 / eps) bound the difference; the bound used is
// |fd − grad| ≤ 2e-3 + 1e-2·|grad| per element on these small cases (measured worst:
// printed by the test). Dropout's keep mask depends only on (seed, b, head, i, j), so the
// loss is a smooth function of every input for a fixed seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>

#include "mha_test_util.hpp"
#include "attn/error.hpp"
#include "attn/mha.hpp"

namespace {

using attn::DType;
using attn::MhaConfig;
using attn::MhaForwardOptions;
using attn::MhaForwardState;
using attn::MhaGradients;
using attn::MhaTrainOptions;
using attn::MultiHeadAttention;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::mha_test::message;
using attn::mha_test::random_tensor;


struct Case {
    MhaConfig config;
    std::int64_t B = 2, Lq = 3, Lk = 4;
    bool self = false, unbatched = false, kpm = false, attn_mask = false;
    attn::Causal causal = attn::Causal::none;
    double dropout_p = 0.0;
};

void check_case(const Case& cs, unsigned seed) {
    std::mt19937 rng(seed);
    MultiHeadAttention m(cs.config);
    const MhaConfig& c = m.config();
    for (const auto& [name, shape] : m.parameter_shapes()) {
        const Tensor t = random_tensor(shape, rng, 0.5);
        std::memcpy(m.parameter(name).data(), t.data(), t.nbytes());
    }
    auto shape_of = [&](std::int64_t L, std::int64_t F) {
        if (cs.unbatched) return Shape{L, F};
        return c.batch_first ? Shape{cs.B, L, F} : Shape{L, cs.B, F};
    };
    Tensor q = random_tensor(shape_of(cs.Lq, c.embed_dim), rng);
    Tensor k = random_tensor(shape_of(cs.Lk, c.kdim), rng);
    Tensor v = random_tensor(shape_of(cs.Lk, c.vdim), rng);
    const Tensor r = random_tensor(shape_of(cs.Lq, c.embed_dim), rng);
    MhaForwardOptions opt;
    opt.causal = cs.causal;
    Tensor kpm, am;
    if (cs.kpm) {  // last key of batch item 0 padded
        kpm = Tensor(DType::boolean, cs.unbatched ? Shape{cs.Lk} : Shape{cs.B, cs.Lk}, true);
        static_cast<bool*>(kpm.data())[cs.Lk - 1] = true;
        opt.key_padding_mask = kpm.view();
    }
    if (cs.attn_mask) {
        am = random_tensor(Shape{cs.Lq, cs.Lk}, rng);
        opt.attn_mask = am.view();
    }
    const MhaTrainOptions train{cs.dropout_p, 1234 + seed};
    auto loss = [&]() {
        MhaForwardState st;
        const TensorView kv = cs.self ? q.view() : k.view();
        const TensorView vv = cs.self ? q.view() : v.view();
        const Tensor y = m.forward_train(q, kv, vv, opt, train, st);
        double s = 0;
        for (std::int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.data_as<float>()[i]) * r.data_as<float>()[i];
        return s;
    };
    MhaForwardState st;
    const Tensor y = m.forward_train(q, cs.self ? q.view() : k.view(), cs.self ? q.view() : v.view(), opt, train, st);
    MhaGradients g = m.backward(st, r);

    // With dropout 0 the training forward is the eval forward.
    if (cs.dropout_p == 0.0) {
        const attn::MhaOutput ev = m.forward(q, cs.self ? q.view() : k.view(), cs.self ? q.view() : v.view(), [&] {
            MhaForwardOptions o = opt;
            o.need_weights = false;
            return o;
        }());
        for (std::int64_t i = 0; i < y.numel(); ++i)
            ASSERT_NEAR(y.data_as<float>()[i], ev.output.data_as<float>()[i], 1e-5) << i;
    }

    double worst = 0;
    auto fd_check = [&](float* x, const Tensor& grad, std::int64_t n, const std::string& name) {
        ASSERT_EQ(grad.numel(), n) << name;
        const float eps = 1e-2f;
        for (std::int64_t i = 0; i < n; ++i) {
            const float keep = x[i];
            x[i] = keep + eps;
            const double lp = loss();
            x[i] = keep - eps;
            const double lm = loss();
            x[i] = keep;
            const double fd = (lp - lm) / (2.0 * static_cast<double>(eps));
            const double an = grad.data_as<float>()[i];
            ASSERT_TRUE(std::isfinite(an)) << name << "[" << i << "]";
            const double err = std::abs(fd - an);
            worst = std::max(worst, err / (2e-3 + 1e-2 * std::abs(an)));
            ASSERT_LE(err, 2e-3 + 1e-2 * std::abs(an)) << name << "[" << i << "]: finite difference " << fd << ", backward " << an;
        }
    };
    for (const auto& [name, t] : g.params) fd_check(m.parameter(name).data_as<float>(), t, t.numel(), name);
    if (cs.self) {
        // one input used three times: its gradient is the sum
        Tensor sum(DType::f32, q.shape());
        for (std::int64_t i = 0; i < q.numel(); ++i)
            sum.data_as<float>()[i] = g.query.data_as<float>()[i] + g.key.data_as<float>()[i] + g.value.data_as<float>()[i];
        fd_check(q.data_as<float>(), sum, q.numel(), "query");
    } else {
        fd_check(q.data_as<float>(), g.query, q.numel(), "query");
        fd_check(k.data_as<float>(), g.key, k.numel(), "key");
        fd_check(v.data_as<float>(), g.value, v.numel(), "value");
    }
    std::printf("worst |fd - grad| / bound = %.3f\n", worst);
}

TEST(MhaBackward, CrossKdimVdimBiasKvZeroAttnDropout) {
    Case cs;
    cs.config = MhaConfig{6, 2, 5, 3, 0, true, false, true, true};
    cs.kpm = cs.attn_mask = true;
    cs.dropout_p = 0.3;
    check_case(cs, 1);
}

TEST(MhaBackward, SelfCausalGqaDropoutBatchFirst) {
    Case cs;
    cs.config = MhaConfig{8, 4, 0, 0, 2, true, true, false, false};
    cs.self = true;
    cs.causal = attn::Causal::top_left;
    cs.Lq = cs.Lk = 5;
    cs.dropout_p = 0.5;
    check_case(cs, 2);
}

// Bottom-right causal cross-attention (Lq < Lk: query i sees keys 0..i + Lk − Lq): the backward
// reads the alignment from the state the forward filled.
TEST(MhaBackward, CrossBottomRightCausalDropout) {
    Case cs;
    cs.config = MhaConfig{6, 2, 5, 3};
    cs.causal = attn::Causal::bottom_right;
    cs.Lq = 3;
    cs.Lk = 6;
    cs.kpm = true;
    cs.dropout_p = 0.25;
    check_case(cs, 4);
    cs.dropout_p = 0.0;  // also against the eval forward (check_case compares them without dropout)
    check_case(cs, 5);
}

TEST(MhaBackward, UnbatchedNoBiasNoDropoutPadded) {
    Case cs;
    cs.config = MhaConfig{4, 1, 0, 0, 0, false, false, false, false};
    cs.unbatched = cs.kpm = true;
    check_case(cs, 3);
}

TEST(MhaBackward, DropoutIsReproducibleAndActive) {
    std::mt19937 rng(9);
    MultiHeadAttention m(MhaConfig{8, 2});
    attn::mha_test::randomise(m, rng);
    const Tensor x = random_tensor(Shape{6, 2, 8}, rng);
    MhaForwardState s1, s2, s3;
    const Tensor a = m.forward_train(x, x, x, {}, MhaTrainOptions{0.4, 7}, s1);
    const Tensor b = m.forward_train(x, x, x, {}, MhaTrainOptions{0.4, 7}, s2);
    const Tensor c = m.forward_train(x, x, x, {}, MhaTrainOptions{0.4, 8}, s3);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
    ASSERT_NE(std::memcmp(a.data(), c.data(), a.nbytes()), 0);
}

// forward_train's output has forward()'s dtype: out_dtype, else a 16-bit query's, else float32 —
// the float32 result rounded once. It was float32 whatever out_dtype said.
TEST(MhaBackward, TrainOutputHasTheForwardsDtype) {
    std::mt19937 rng(11);
    MultiHeadAttention m(MhaConfig{8, 2});
    attn::mha_test::randomise(m, rng);
    const Tensor x = to_dtype(random_tensor(Shape{5, 2, 8}, rng).view(), DType::bf16);
    MhaForwardOptions f32_out;
    f32_out.out_dtype = DType::f32;
    MhaForwardState s1, s2, s3;
    const Tensor y32 = m.forward_train(x, x, x, f32_out, {}, s1);
    ASSERT_EQ(y32.dtype(), DType::f32);
    const Tensor by_default = m.forward_train(x, x, x, {}, {}, s2);  // the query's bfloat16
    ASSERT_EQ(by_default.dtype(), DType::bf16);
    const Tensor rounded = to_dtype(y32.view(), DType::bf16);
    EXPECT_EQ(std::memcmp(by_default.data(), rounded.data(), rounded.nbytes()), 0);
    MhaForwardOptions f16_out;
    f16_out.out_dtype = DType::f16;
    const Tensor y16 = m.forward_train(x, x, x, f16_out, {}, s3);
    ASSERT_EQ(y16.dtype(), DType::f16);
    const Tensor want16 = to_dtype(y32.view(), DType::f16);
    EXPECT_EQ(std::memcmp(y16.data(), want16.data(), want16.nbytes()), 0);
    // and forward() gives the same bits
    MhaForwardOptions no_weights;
    no_weights.need_weights = false;
    const attn::MhaOutput f = m.forward(x, x, x, no_weights);
    ASSERT_EQ(f.output.dtype(), DType::bf16);
    EXPECT_EQ(std::memcmp(f.output.data(), by_default.data(), rounded.nbytes()), 0);
}

TEST(MhaBackward, ArgumentErrors) {
    MultiHeadAttention m(MhaConfig{4, 2});
    const Tensor x(DType::f32, Shape{3, 1, 4}, true);
    MhaForwardState st;
    try {
        m.forward_train(x, x, x, {}, MhaTrainOptions{1.0, 0}, st);
        FAIL() << "dropout_p = 1 accepted";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("dropout_p"), std::string::npos) << e.what();
    }
    try {  // a forgotten seed would drop the same weights every training step
        m.forward_train(x, x, x, {}, MhaTrainOptions{0.4, std::nullopt}, st);
        FAIL() << "dropout_p = 0.4 without a seed accepted";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("MultiHeadAttention: dropout_seed: dropout_p = 0.4 needs a seed"), std::string::npos)
            << e.what();
    }
    EXPECT_THROW(m.backward(st, x), attn::Error);  // state never filled
    m.forward_train(x, x, x, {}, {}, st);
    {  // A moved-from state is empty: it passed the check and read the freed copies (ASan: kernels_asan).
        MhaForwardState moved = std::move(st);
        EXPECT_NO_THROW(m.backward(moved, x));
    }
    EXPECT_NE(message([&] { m.backward(st, x); }).find("backward: the state is empty"), std::string::npos);
    m.forward_train(x, x, x, {}, {}, st);
    const Tensor wrong(DType::f32, Shape{3, 2, 4}, true);
    try {
        m.backward(st, wrong);
        FAIL() << "grad_output of the wrong shape accepted";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("grad_output"), std::string::npos) << e.what();
    }
}

// A state filled by another layer, or edited by hand, is an error naming what differs — the
// K/V gradient GEMMs used to read the saved key with this layer's kdim (a heap read past the
// buffer, found by a review under ASan; kernels_asan runs test_mha).
TEST(MhaBackward, StateOfAnotherLayerOrEditedIsAnError) {
    MhaConfig a{8, 2};
    a.kdim = a.vdim = 4;
    const Tensor q(DType::f32, Shape{5, 2, 8}, true), kv(DType::f32, Shape{6, 2, 4}, true), dy(DType::f32, Shape{5, 2, 8}, true);
    MultiHeadAttention la(a);
    MhaForwardState st;
    la.forward_train(q, kv, kv, {}, {}, st);
    EXPECT_NO_THROW(la.backward(st, dy));
    MhaConfig b = a;
    b.kdim = b.vdim = 64;
    EXPECT_EQ(message([&] { MultiHeadAttention(b).backward(st, dy); }),
              "MultiHeadAttention: backward: the state was filled by a layer with kdim = 4 but this layer has kdim = 64");
    MhaConfig c = a;
    c.add_bias_kv = true;
    EXPECT_EQ(message([&] { MultiHeadAttention(c).backward(st, dy); }),
              "MultiHeadAttention: backward: the state was filled by a layer with add_bias_kv = false but this layer "
              "has add_bias_kv = true");
    MhaConfig d = a;
    d.batch_first = true;
    EXPECT_NE(message([&] { MultiHeadAttention(d).backward(st, dy); }).find("batch_first = false"), std::string::npos);
    // Edited by hand: a saved tensor or size that forward_train would not have made.
    MhaForwardState e1 = std::move(st);
    e1.x[1] = Tensor(DType::f32, Shape{6, 2, 64}, true);
    EXPECT_NE(message([&] { la.backward(e1, dy); }).find("the state's key copy must be float32 (6, 2, 4) but is float32 (6, 2, 64)"), std::string::npos);
    MhaForwardState e2;
    la.forward_train(q, kv, kv, {}, {}, e2);
    e2.Lkx += 1;
    EXPECT_NE(message([&] { la.backward(e2, dy); }).find("Lkx"), std::string::npos);
    MhaForwardState e3;
    la.forward_train(q, kv, kv, {}, {}, e3);
    e3.k = Tensor(DType::f32, Shape{1, 8}, true);
    EXPECT_NE(message([&] { la.backward(e3, dy); }).find("the state's k must be float32 (12, 8)"), std::string::npos);
    // The packed state: the same rule.
    MhaForwardState p;
    const Tensor qp(DType::f32, Shape{5, 8}, true), kp(DType::f32, Shape{6, 4}, true), dyp(DType::f32, Shape{5, 8}, true);
    std::int64_t cq[] = {0, 5}, ck[] = {0, 6};
    const TensorView cuq(cq, DType::i64, Shape{2}), cuk(ck, DType::i64, Shape{2});
    la.forward_packed_train(qp, kp, kp, cuq, cuk, {}, {}, p);
    EXPECT_NO_THROW(la.backward(p, dyp));
    EXPECT_EQ(message([&] { MultiHeadAttention(b).backward(p, dyp); }),
              "MultiHeadAttention: backward: the state was filled by a layer with kdim = 4 but this layer has kdim = 64");
}

// forward_train checks its inputs with forward's own checks: the same message, word for word.
TEST(MhaBackward, ForwardTrainErrorsAreForwardErrors) {
    MultiHeadAttention m(MhaConfig{4, 2});
    const Tensor x(DType::f32, Shape{3, 2, 4}, true), k(DType::f32, Shape{5, 1, 4}, true), am(DType::boolean, Shape{3, 4}, true);
    attn::MhaForwardOptions o;
    o.attn_mask = am.view();
    MhaForwardState st;
    for (const auto& [q, kv, opt] : {std::tuple{&x, &x, o}, std::tuple{&x, &k, attn::MhaForwardOptions{}}}) {
        const std::string train = message([&, q = q, kv = kv, &opt = opt] { m.forward_train(*q, *kv, *kv, opt, {}, st); });
        EXPECT_EQ(train.rfind("MultiHeadAttention: ", 0), 0u) << train;
        EXPECT_EQ(train, message([&, q = q, kv = kv, &opt = opt] { m.forward(*q, *kv, *kv, opt); }));
    }
}

}  // namespace
