// MultiHeadAttention::forward_packed (packed (T, E) input with cu_seqlens, sdpa_varlen inside)
// against two oracles built from forward(): each sequence alone (a batch of one), and the
// batch padded to the longest sequence with key_padding_mask. The GEMMs see other row blocks
// (linear.hpp blocks by shape), so the budget is fp32 rounding: 1e-5 of the largest output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mha_test_util.hpp"
#include "varlen/varlen_util.hpp"  // cu_seqlens: the packed layout's offsets
#include "attn/error.hpp"

namespace {

using namespace attn;
using attn::mha_test::random_tensor;
using attn::mha_test::message;
using attn::mha_test::randomise;
using attn::test::max_abs;

// The layer's cu_seqlens, int64.
Tensor cu(const std::vector<std::int64_t>& len) { return test::cu_seqlens(len, DType::i64); }

struct Config {
    std::int64_t E, h, hkv, kdim;
    bool causal;
};

void check(const Config& cfg, std::uint32_t seed) {
    std::mt19937 rng(seed);
    MhaConfig mc;
    mc.embed_dim = cfg.E;
    mc.num_heads = cfg.h;
    mc.num_kv_heads = cfg.hkv;
    mc.kdim = mc.vdim = cfg.kdim;
    MultiHeadAttention m(mc);
    randomise(m, rng);
    const std::vector<std::int64_t> len = {5, 1, 17, 40, 3};
    const auto N = static_cast<std::int64_t>(len.size());
    std::int64_t T = 0, Lmax = 0;
    for (auto l : len) T += l, Lmax = std::max(Lmax, l);
    const bool self = cfg.kdim == cfg.E;
    const Tensor x = random_tensor(Shape{T, cfg.E}, rng);
    const Tensor kx_own = self ? Tensor() : random_tensor(Shape{T, cfg.kdim}, rng);
    const Tensor vx_own = self ? Tensor() : random_tensor(Shape{T, cfg.kdim}, rng);
    const TensorView kx = self ? x.view() : kx_own.view(), vx = self ? x.view() : vx_own.view();
    const Tensor c = cu(len);
    MhaPackedOptions po;
    po.causal = cfg.causal ? Causal::top_left : Causal::none;
    const Tensor got = m.forward_packed(x, kx, vx, c, c, po);
    ASSERT_EQ(got.shape(), (Shape{T, cfg.E}));
    const double den = max_abs(got) + 1e-30;

    // Oracle 1: each sequence alone, (L, 1, E).
    MhaForwardOptions fo;
    fo.need_weights = false;
    fo.causal = cfg.causal ? attn::Causal::top_left : attn::Causal::none;
    std::int64_t t0 = 0;
    for (std::int64_t b = 0; b < N; ++b) {
        const std::int64_t L = len[static_cast<std::size_t>(b)];
        auto seq = [&](const TensorView& t) {
            const TensorView r = t.slice(0, t0, L);
            return TensorView(r.data(), r.dtype(), Shape{L, 1, r.dim(1)}, Strides{r.stride(0), 0, r.stride(1)});
        };
        const MhaOutput want = m.forward(seq(x), seq(kx), seq(vx), fo);
        for (std::int64_t i = 0; i < L; ++i)
            for (std::int64_t e = 0; e < cfg.E; ++e)
                ASSERT_LE(std::fabs(got.data_as<float>()[(t0 + i) * cfg.E + e] - want.output.data_as<float>()[i * cfg.E + e]) / den, 1e-5)
                    << "sequence " << b << " row " << i << " col " << e;
        t0 += L;
    }

    // Oracle 2: the padded batch (Lmax, N, E), key_padding_mask True on the padding keys.
    const Tensor px(DType::f32, Shape{Lmax, N, cfg.E}, true), pk(DType::f32, Shape{Lmax, N, cfg.kdim}, true),
        pv(DType::f32, Shape{Lmax, N, cfg.kdim}, true), kpm(DType::boolean, Shape{N, Lmax}, true);
    t0 = 0;
    for (std::int64_t b = 0; b < N; ++b) {
        const std::int64_t L = len[static_cast<std::size_t>(b)];
        for (std::int64_t i = 0; i < Lmax; ++i) kpm.data_as<bool>()[b * Lmax + i] = i >= L;
        for (std::int64_t i = 0; i < L; ++i) {
            for (std::int64_t e = 0; e < cfg.E; ++e) px.data_as<float>()[(i * N + b) * cfg.E + e] = x.data_as<float>()[(t0 + i) * cfg.E + e];
            for (std::int64_t e = 0; e < cfg.kdim; ++e) {
                pk.data_as<float>()[(i * N + b) * cfg.kdim + e] = kx.data_as<float>()[(t0 + i) * cfg.kdim + e];
                pv.data_as<float>()[(i * N + b) * cfg.kdim + e] = vx.data_as<float>()[(t0 + i) * cfg.kdim + e];
            }
        }
        t0 += L;
    }
    fo.key_padding_mask = kpm.view();
    const MhaOutput pad = self ? m.forward(px, px, px, fo) : m.forward(px, pk, pv, fo);
    t0 = 0;
    for (std::int64_t b = 0; b < N; ++b) {
        for (std::int64_t i = 0; i < len[static_cast<std::size_t>(b)]; ++i)
            for (std::int64_t e = 0; e < cfg.E; ++e)
                ASSERT_LE(std::fabs(got.data_as<float>()[(t0 + i) * cfg.E + e] - pad.output.data_as<float>()[(i * N + b) * cfg.E + e]) / den,
                          1e-5)
                    << "padded: sequence " << b << " row " << i << " col " << e;
        t0 += len[static_cast<std::size_t>(b)];
    }
}

TEST(MhaPacked, MatchesSequencesAloneAndPaddedBatch) {
    const Config configs[] = {{32, 4, 4, 32, true}, {32, 4, 2, 32, false}, {48, 6, 3, 20, true}, {16, 2, 1, 16, true}};
    std::uint32_t seed = 1;
    for (const Config& c : configs) {
        SCOPED_TRACE("E=" + std::to_string(c.E) + " h=" + std::to_string(c.h) + " hkv=" + std::to_string(c.hkv) +
                     " kdim=" + std::to_string(c.kdim) + " causal=" + std::to_string(c.causal));
        check(c, seed++);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

double rms(const TensorView& a, const TensorView& b) {
    double s = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) s += std::pow(a.load_as_double(i) - b.load_as_double(i), 2);
    return std::sqrt(s / static_cast<double>(a.numel()));
}

// intermediate_dtype on packed input: each sequence's rows are what forward() with the same
// option gives that sequence alone — within 4u of the largest output (a 16-bit rounding may
// flip where the GEMMs' float32 sums differ in the last bit: other row blocks), and far nearer
// it than forward() with float32 intermediates is (rms ratio ≤ ¼: the option reached the packed path).
TEST(MhaPacked, HalfIntermediatesMatchSequencesAlone) {
    for (const DType dt : {DType::f16, DType::bf16}) {
        SCOPED_TRACE(dtype_name(dt));
        const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
        std::mt19937 rng(dt == DType::bf16 ? 41 : 42);
        MhaConfig mc;
        mc.embed_dim = 48;
        mc.num_heads = 4;
        mc.num_kv_heads = 2;
        mc.param_dtype = dt;
        MultiHeadAttention m(mc);
        randomise(m, rng);
        const std::vector<std::int64_t> len = {7, 1, 33, 12};
        std::int64_t T = 0;
        for (auto l : len) T += l;
        const Tensor x = to_dtype(random_tensor(Shape{T, 48}, rng).view(), dt);
        const Tensor c = cu(len);
        MhaPackedOptions po;
        po.causal = Causal::top_left;
        po.intermediate_dtype = dt;
        const Tensor got = to_dtype(m.forward_packed(x, x, x, c, c, po).view(), DType::f32);
        MhaForwardOptions fo;
        fo.need_weights = false;
        fo.causal = attn::Causal::top_left;
        fo.out_dtype = dt;  // the packed output's dtype: the 16-bit query's
        MhaForwardOptions f32 = fo;
        fo.intermediate_dtype = dt;
        Tensor want(DType::f32, Shape{T, 48}), wide(DType::f32, Shape{T, 48});
        std::int64_t t0 = 0;
        for (const std::int64_t L : len) {
            const TensorView r = x.view().slice(0, t0, L);
            const TensorView seq(r.data(), r.dtype(), Shape{L, 1, 48}, Strides{r.stride(0), 0, r.stride(1)});
            const Tensor a = to_dtype(m.forward(seq, seq, seq, fo).output.view(), DType::f32);
            const Tensor b = to_dtype(m.forward(seq, seq, seq, f32).output.view(), DType::f32);
            std::memcpy(want.data_as<float>() + t0 * 48, a.data(), a.nbytes());
            std::memcpy(wide.data_as<float>() + t0 * 48, b.data(), b.nbytes());
            t0 += L;
        }
        const double scale = max_abs(want);
        for (std::int64_t i = 0; i < T * 48; ++i)
            ASSERT_LE(std::fabs(got.data_as<float>()[i] - want.data_as<float>()[i]), 4 * u * scale) << "element " << i;
        EXPECT_LE(rms(got, want), 0.25 * rms(want, wide));
    }
    // Training keeps float32 intermediates.
    MultiHeadAttention m32(MhaConfig{.embed_dim = 8, .num_heads = 2});
    const Tensor x(DType::f32, Shape{3, 8}, true);
    MhaPackedOptions po;
    po.intermediate_dtype = DType::bf16;
    MhaForwardState st;
    try {
        (void)m32.forward_packed_train(x, x, x, cu({3}), cu({3}), po, {}, st);
        FAIL() << "forward_packed_train took bfloat16 intermediates";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("intermediate_dtype: forward_packed_train keeps float32 intermediates"), std::string::npos)
            << e.what();
    }
}

TEST(MhaPacked, BadInputIsAClearError) {
    MhaConfig mc;
    mc.embed_dim = 8;
    mc.num_heads = 2;
    MultiHeadAttention m(mc);
    const Tensor x(DType::f32, Shape{6, 8}, true), bad(DType::f32, Shape{6, 7}, true);
    const Tensor c = cu({2, 4}), c_short = cu({2, 3});
    EXPECT_NE(message([&] { (void)m.forward_packed(bad, x, x, c, c); })
                  .find("MultiHeadAttention.forward_packed: query: expected 8 features (embed_dim) but got 7"),
              std::string::npos);
    EXPECT_NE(message([&] { (void)m.forward_packed(x, x, x, c_short, c); }).find("cu_seqlens_q: last entry must equal q's token count 6 but got 5"),
              std::string::npos);
    mc.add_bias_kv = true;
    MultiHeadAttention mb(mc);
    EXPECT_NE(message([&] { (void)mb.forward_packed(x, x, x, c, c); }).find("add_bias_kv / add_zero_attn: not supported"),
              std::string::npos);
}

}  // namespace
