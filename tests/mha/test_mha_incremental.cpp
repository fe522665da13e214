// MultiHeadAttention::forward_incremental: a sequence fed through a KV cache in any split equals one causal
// forward of the layer over the whole sequence (fp32 ≤ 1e-5; 16-bit storage within a bound
// derived below from the rounding of K and V).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <limits>
#include <random>
#include <vector>

#include "mha_test_util.hpp"
#include "attn/error.hpp"
#include "attn/mha_incremental.hpp"

namespace {

using attn::DType;
using attn::KVCache;
using attn::KVCacheConfig;
using attn::MhaConfig;
using attn::MultiHeadAttention;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::mha_test::random_tensor;
using attn::mha_test::randomise;
using attn::test::max_abs_diff;

Tensor nan_tensor(const Shape& s) {
    Tensor t(DType::f32, s);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    return t;
}

double at(const TensorView& t, std::int64_t i, std::int64_t j, std::int64_t k) {
    return t.load_as_double(t.offset(i, j, k));
}

struct Shapes {
    std::int64_t E = 32, h = 4, hkv = 4, B = 2, L = 45;
    bool batch_first = true;
};

// Feeds x (batch_first: (B, L, E), else (L, B, E)) in the given chunks and returns the
// concatenated outputs, shaped like x.
Tensor feed(const MultiHeadAttention& m, const Tensor& x, const Shapes& s, KVCache& cache, const std::vector<std::int64_t>& chunks) {
    Tensor out = nan_tensor(x.shape());
    const int ldim = s.batch_first ? 1 : 0;
    std::int64_t start = 0;
    attn::MhaWorkspace ws;
    for (std::int64_t T : chunks) {
        Tensor o = m.forward_incremental(x.view().slice(ldim, start, T), cache, &ws);
        const TensorView dst = out.view().slice(ldim, start, T);
        for (std::int64_t a = 0; a < o.view().dim(0); ++a)
            for (std::int64_t b = 0; b < o.view().dim(1); ++b)
                for (std::int64_t e = 0; e < s.E; ++e) {
                    dst.data_as<float>()[dst.offset(a, b, e)] = o.data_as<float>()[(a * o.view().dim(1) + b) * s.E + e];
                }
        start += T;
    }
    EXPECT_EQ(start, s.L);
    return out;
}

// Per-element bound on |incremental − full| when the cache rounds K and V with unit
// roundoff u (relative error ≤ u per element), from the layer's projections and softmax
// recomputed here in double. For query i of a head, keys j ≤ i:
//   score error     |Δs_j| ≤ scale · u · Σ_d |q_d||k_jd|,  δ = max_j of that
//   softmax         p'_j / p_j ∈ [e^{−2δ}, e^{2δ}]  ⇒  |Δp_j| ≤ p_j (e^{2δ} − 1)
//   head output     |ΔO_c| ≤ Σ_j p_j |v_jc| · ((e^{2δ} − 1)(1 + u) + u)
//   layer output    |Δy_r| ≤ Σ_c |W_O[r, c]| · |ΔO_c|   (+ 1e-5 for the fp32 arithmetic)
// Returned in x's layout (one bound per output element).
std::vector<double> storage_bound(const MultiHeadAttention& m, const Tensor& x, const Shapes& s, double u) {
    const TensorView w = m.parameter("in_proj_weight"), bias = m.parameter("in_proj_bias");
    const std::int64_t E = s.E, dh = E / s.h, Ekv = s.hkv * dh, n = E + 2 * Ekv, group = s.h / s.hkv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    const float* wo = m.parameter("out_proj.weight").data_as<const float>();
    std::vector<double> bound(static_cast<std::size_t>(s.B * s.L * E));
    for (std::int64_t b = 0; b < s.B; ++b) {
        std::vector<double> proj(static_cast<std::size_t>(s.L * n));
        for (std::int64_t t = 0; t < s.L; ++t)
            for (std::int64_t r = 0; r < n; ++r) {
                double acc = bias.data_as<const float>()[r];
                for (std::int64_t e = 0; e < E; ++e)
                    acc += (s.batch_first ? at(x.view(), b, t, e) : at(x.view(), t, b, e)) * w.data_as<const float>()[r * E + e];
                proj[static_cast<std::size_t>(t * n + r)] = acc;
            }
        auto P = [&](std::int64_t t, std::int64_t col) { return proj[static_cast<std::size_t>(t * n + col)]; };
        for (std::int64_t i = 0; i < s.L; ++i) {
            std::vector<double> dO(static_cast<std::size_t>(E));
            for (std::int64_t hd = 0; hd < s.h; ++hd) {
                const std::int64_t kc = E + (hd / group) * dh, vc = E + Ekv + (hd / group) * dh;
                std::vector<double> sc(static_cast<std::size_t>(i + 1));
                double mx = -1e300, delta = 0;
                for (std::int64_t j = 0; j <= i; ++j) {
                    double dot = 0, absdot = 0;
                    for (std::int64_t d = 0; d < dh; ++d) {
                        dot += P(i, hd * dh + d) * P(j, kc + d);
                        absdot += std::fabs(P(i, hd * dh + d) * P(j, kc + d));
                    }
                    sc[static_cast<std::size_t>(j)] = dot * scale;
                    mx = std::max(mx, dot * scale);
                    delta = std::max(delta, scale * u * absdot);
                }
                double sum = 0;
                for (double& v : sc) sum += (v = std::exp(v - mx));
                const double f = std::expm1(2 * delta) * (1 + u) + u;
                for (std::int64_t d = 0; d < dh; ++d) {
                    double acc = 0;
                    for (std::int64_t j = 0; j <= i; ++j) acc += sc[static_cast<std::size_t>(j)] / sum * std::fabs(P(j, vc + d));
                    dO[static_cast<std::size_t>(hd * dh + d)] = acc * f;
                }
            }
            for (std::int64_t r = 0; r < E; ++r) {
                double acc = 0;
                for (std::int64_t c = 0; c < E; ++c) acc += std::fabs(wo[r * E + c]) * dO[static_cast<std::size_t>(c)];
                const std::int64_t idx = s.batch_first ? (b * s.L + i) * E + r : (i * s.B + b) * E + r;
                bound[static_cast<std::size_t>(idx)] = acc + 1e-5;
            }
        }
    }
    return bound;
}

void run_case(const Shapes& s, DType storage, const std::vector<std::int64_t>& chunks, unsigned seed, double u) {
    std::mt19937 rng(seed);
    MhaConfig c;
    c.embed_dim = s.E;
    c.num_heads = s.h;
    c.num_kv_heads = s.hkv;
    c.batch_first = s.batch_first;
    MultiHeadAttention m(c);
    randomise(m, rng);
    const Tensor x = s.batch_first ? random_tensor(Shape{s.B, s.L, s.E}, rng) : random_tensor(Shape{s.L, s.B, s.E}, rng);
    attn::MhaForwardOptions fo;
    fo.causal = attn::Causal::top_left;
    fo.need_weights = false;
    const Tensor full = m.forward(x.view(), x.view(), x.view(), fo).output;

    KVCacheConfig kc;
    kc.batch = s.B;
    kc.kv_heads = s.hkv;
    kc.head_dim = s.E / s.h;
    kc.capacity = 8;
    kc.grow = true;
    kc.storage = storage;
    KVCache cache(kc);
    const Tensor inc = feed(m, x, s, cache, chunks);
    for (std::int64_t b = 0; b < s.B; ++b) EXPECT_EQ(cache.length(b), s.L);
    if (storage == DType::f32) {
        EXPECT_LE(max_abs_diff(inc, full), 1e-5) << "chunks " << chunks.size();
        // The last chunk's T tokens attend to the whole sequence as forward() does with them as the
        // query, the sequence as key and value, causal bottom-right (Lq = T < Lk = L): the
        // incremental path's alignment is MhaForwardOptions::causal's.
        const std::int64_t T = chunks.back(), ldim = s.batch_first ? 1 : 0;
        attn::MhaForwardOptions tail_options = fo;
        tail_options.causal = attn::Causal::bottom_right;
        const Tensor tail = m.forward(x.view().slice(ldim, s.L - T, T), x.view(), x.view(), tail_options).output;
        EXPECT_LE(max_abs_diff(tail, inc.view().slice(ldim, s.L - T, T)), 1e-5) << "chunks " << chunks.size();
        return;
    }
    const std::vector<double> bound = storage_bound(m, x, s, u);
    double worst_ratio = 0, max_bound = 0;
    for (std::int64_t i = 0; i < inc.numel(); ++i) {
        const double d = std::fabs(static_cast<double>(inc.data_as<float>()[i]) - full.data_as<float>()[i]);
        const double r = std::isnan(d) ? 1e300 : d / bound[static_cast<std::size_t>(i)];
        worst_ratio = std::max(worst_ratio, r);
        max_bound = std::max(max_bound, bound[static_cast<std::size_t>(i)]);
    }
    EXPECT_LE(worst_ratio, 1.0) << attn::dtype_name(storage) << ": an element exceeds its derived bound";
    // The bound is meaningful only when it is well below the outputs' O(1) size.
    EXPECT_LT(max_bound, 0.5) << attn::dtype_name(storage);
    std::printf("%s: worst |err| / bound = %.3f, largest bound %.3g\n", std::string(attn::dtype_name(storage)).c_str(),
                worst_ratio, max_bound);
}

std::vector<std::int64_t> ones(std::int64_t n) { return std::vector<std::int64_t>(static_cast<std::size_t>(n), 1); }

TEST(MhaIncremental, TokenByTokenEqualsCausalForwardF32) {
    for (bool bf : {true, false}) {
        for (std::int64_t hkv : {4, 2, 1}) {
            Shapes s;
            s.batch_first = bf;
            s.hkv = hkv;
            run_case(s, DType::f32, ones(s.L), 1u + static_cast<unsigned>(hkv), 0);
        }
    }
}

TEST(MhaIncremental, ChunksIncludingPrefillEqualCausalForwardF32) {
    Shapes s;  // 45 = 20 (prefill: sdpa) + 1 + 16 (decode's largest) + 3 + 5
    for (bool bf : {true, false}) {
        s.batch_first = bf;
        run_case(s, DType::f32, {20, 1, 16, 3, 5}, 7, 0);
        run_case(s, DType::f32, {3, 17, 25}, 8, 0);  // prefill blocks after a cached prefix
    }
    Shapes g = s;
    g.hkv = 2;
    run_case(g, DType::f32, {2, 30, 13}, 9, 0);
}

TEST(MhaIncremental, SixteenBitStorageWithinDerivedBound) {
    Shapes s;
    const double u16 = std::ldexp(1.0, -11), ubf = std::ldexp(1.0, -8);  // round-to-nearest unit roundoff
    run_case(s, DType::f16, {20, 1, 16, 3, 5}, 11, u16);
    run_case(s, DType::bf16, {20, 1, 16, 3, 5}, 12, ubf);
    s.hkv = 2;
    run_case(s, DType::f16, ones(s.L), 13, u16);
    run_case(s, DType::bf16, {17, 28}, 14, ubf);
}

TEST(MhaIncremental, UnbatchedInputUsesABatchOneCache) {
    std::mt19937 rng(21);
    MhaConfig c;
    c.embed_dim = 16;
    c.num_heads = 2;
    MultiHeadAttention m(c);
    randomise(m, rng);
    const Tensor x = random_tensor(Shape{24, 16}, rng);
    attn::MhaForwardOptions fo;
    fo.causal = attn::Causal::top_left;
    fo.need_weights = false;
    const Tensor full = m.forward(x.view(), x.view(), x.view(), fo).output;
    KVCacheConfig kc;
    kc.kv_heads = 2;
    kc.head_dim = 8;
    kc.capacity = 24;
    KVCache cache(kc);
    Tensor a = m.forward_incremental(x.view().slice(0, 0, 18), cache);
    Tensor b = m.forward_incremental(x.view().slice(0, 18, 6), cache);
    double err = 0;
    for (std::int64_t i = 0; i < 24 * 16; ++i) {
        const float got = i < 18 * 16 ? a.data_as<float>()[i] : b.data_as<float>()[i - 18 * 16];
        err = attn::test::worse(err, std::fabs(static_cast<double>(got) - full.data_as<float>()[i]));
    }
    EXPECT_LE(err, 1e-5);
}

// Sequences of one batch at different lengths: sequence 1 is rolled back after the first
// block, so its later tokens follow a shorter history. Each must match its own forward.
TEST(MhaIncremental, SequencesOfDifferentLengths) {
    std::mt19937 rng(31);
    const std::int64_t E = 24, L0 = 10, L1 = 6, M = 22;
    MhaConfig c;
    c.embed_dim = E;
    c.num_heads = 3;
    c.num_kv_heads = 1;
    c.batch_first = true;
    MultiHeadAttention m(c);
    randomise(m, rng);
    const Tensor y0 = random_tensor(Shape{1, L0 + M, E}, rng), y1 = random_tensor(Shape{1, L1 + M, E}, rng);
    const Tensor junk = random_tensor(Shape{1, L0 - L1, E}, rng);
    for (DType storage : {DType::f32, DType::f16}) {
        KVCacheConfig kc;
        kc.batch = 2;
        kc.kv_heads = 1;
        kc.head_dim = 8;
        kc.capacity = 64;
        kc.storage = storage;
        KVCache cache(kc);
        // block 1: (2, L0, E) = [y0[:L0]; y1[:L1] + junk], then roll sequence 1 back to L1
        Tensor first(DType::f32, Shape{2, L0, E});
        for (std::int64_t t = 0; t < L0; ++t)
            for (std::int64_t e = 0; e < E; ++e) {
                first.data_as<float>()[t * E + e] = y0.data_as<float>()[t * E + e];
                first.data_as<float>()[(L0 + t) * E + e] = t < L1 ? y1.data_as<float>()[t * E + e] : junk.data_as<float>()[(t - L1) * E + e];
            }
        m.forward_incremental(first.view(), cache);
        cache.truncate(1, L1);
        std::vector<float> got0, got1;
        std::int64_t done = 0;
        for (std::int64_t T : {1, 18, 3}) {  // decode, prefill (one call, lengths differ), decode
            Tensor xn(DType::f32, Shape{2, T, E});
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t e = 0; e < E; ++e) {
                    xn.data_as<float>()[t * E + e] = y0.data_as<float>()[(L0 + done + t) * E + e];
                    xn.data_as<float>()[(T + t) * E + e] = y1.data_as<float>()[(L1 + done + t) * E + e];
                }
            Tensor o = m.forward_incremental(xn.view(), cache);
            got0.insert(got0.end(), o.data_as<float>(), o.data_as<float>() + T * E);
            got1.insert(got1.end(), o.data_as<float>() + T * E, o.data_as<float>() + 2 * T * E);
            done += T;
        }
        EXPECT_EQ(cache.length(0), L0 + M);
        EXPECT_EQ(cache.length(1), L1 + M);
        attn::MhaForwardOptions fo;
        fo.causal = attn::Causal::top_left;
        fo.need_weights = false;
        const Tensor f0 = m.forward(y0.view(), y0.view(), y0.view(), fo).output;
        const Tensor f1 = m.forward(y1.view(), y1.view(), y1.view(), fo).output;
        double err = 0;
        for (std::int64_t i = 0; i < M * E; ++i) {
            err = attn::test::worse(err, std::fabs(static_cast<double>(got0[static_cast<std::size_t>(i)]) - f0.data_as<float>()[L0 * E + i]));
            err = attn::test::worse(err, std::fabs(static_cast<double>(got1[static_cast<std::size_t>(i)]) - f1.data_as<float>()[L1 * E + i]));
        }
        // f16: K/V rounding (2^-11 relative) of O(1) values through O(1) weights; the derived
        // bound of SixteenBitStorageWithinDerivedBound is checked there, here 1e-2 suffices
        // to catch a wrong history (errors O(0.1..1)).
        EXPECT_LE(err, storage == DType::f32 ? 1e-5 : 1e-2) << attn::dtype_name(storage);
    }
}

TEST(MhaIncremental, MismatchesAreErrorsBeforeAnythingIsWritten) {
    std::mt19937 rng(41);
    MhaConfig c;
    c.embed_dim = 16;
    c.num_heads = 2;
    c.batch_first = true;
    MultiHeadAttention m(c);
    randomise(m, rng);
    const Tensor x = random_tensor(Shape{2, 3, 16}, rng);
    auto expect_error = [&](const KVCacheConfig& kc, const char* part) {
        KVCache cache(kc);
        Tensor out = nan_tensor(Shape{2, 3, 16});
        try {
            m.forward_incremental_into(x.view(), cache, out.view());
            ADD_FAILURE() << "no error for " << part;
        } catch (const attn::Error& e) {
            EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
        }
        for (std::int64_t b = 0; b < kc.batch; ++b) EXPECT_EQ(cache.length(b), 0);
        for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.data_as<float>()[i]));
    };
    KVCacheConfig ok;
    ok.batch = 2;
    ok.kv_heads = 2;
    ok.head_dim = 8;
    ok.capacity = 8;
    KVCacheConfig bad = ok;
    bad.kv_heads = 1;
    expect_error(bad, "MultiHeadAttention: cache: kv_heads");
    bad = ok;
    bad.head_dim = 4;
    expect_error(bad, "MultiHeadAttention: cache: head_dim");
    bad = ok;
    bad.value_dim = 16;
    expect_error(bad, "MultiHeadAttention: cache: value_dim");
    bad = ok;
    bad.batch = 3;
    expect_error(bad, "MultiHeadAttention: cache: batch");
    bad = ok;
    bad.capacity = 2;  // 3 tokens do not fit, growth off
    expect_error(bad, "");

    KVCache cache(ok);
    EXPECT_THROW(m.forward_incremental(random_tensor(Shape{2, 3, 8}, rng).view(), cache), attn::Error);
    MhaConfig cross = c;
    cross.kdim = 8;
    EXPECT_THROW(MultiHeadAttention(cross).forward_incremental(x.view(), cache), attn::Error);
    MhaConfig extra = c;
    extra.add_bias_kv = true;
    EXPECT_THROW(MultiHeadAttention(extra).forward_incremental(x.view(), cache), attn::Error);
    EXPECT_EQ(cache.length(0), 0);
    // A moved-from cache says so (it was "cache: batch must equal x_new's batch 2 but is 0").
    KVCache taken(std::move(cache));
    try {
        (void)m.forward_incremental(x.view(), cache);
        ADD_FAILURE() << "no error for a moved-from cache";
    } catch (const attn::Error& e) {
        EXPECT_EQ(std::string(e.what()), "MultiHeadAttention: cache: holds no storage (it was moved from)");
    }
    cache = std::move(taken);

    // An output inside the cache's storage: the append would write under it (and a growing
    // cache free it). It was accepted and overwrote cached keys; an exploratory test found it.
    const TensorView in_keys(cache.keys().data(), DType::f32, Shape{2, 3, 16});
    try {
        m.forward_incremental_into(x.view(), cache, in_keys);
        ADD_FAILURE() << "no error for an output in the cache";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("MultiHeadAttention: forward_incremental: output: must not share memory with "
                                             "the cache's keys (the kernel writes output while it still reads the cache's keys)"),
                  std::string::npos) << e.what();
    }
    // An output over one of the layer's parameters would rewrite the layer (forward_into's rule).
    const TensorView over_weight(const_cast<void*>(m.parameter("out_proj.weight").data()), DType::f32, Shape{2, 3, 16});
    try {
        m.forward_incremental_into(x.view(), cache, over_weight);
        ADD_FAILURE() << "no error for an output over out_proj.weight";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("MultiHeadAttention: forward_incremental: output: must not share memory with "
                                             "out_proj.weight"),
                  std::string::npos) << e.what();
    }
    EXPECT_EQ(cache.length(0), 0);
}

// A non-finite sink (a parameter edited in place) is refused before the cache changes: the
// append came first, so a growing cache grew and moved its storage although the step failed.
// load_state_dict refuses one outright, after rounding to the parameter dtype.
TEST(MhaIncremental, NonFiniteSinkIsRefusedBeforeTheCacheGrows) {
    MhaConfig c;
    c.embed_dim = 4;
    c.num_heads = 2;
    c.sinks = true;
    MultiHeadAttention m(c);
    std::vector<std::pair<std::string, TensorView>> sd = m.state_dict();
    Tensor bad_sinks(DType::f64, Shape{2});
    bad_sinks.data_as<double>()[0] = 0.5;
    bad_sinks.data_as<double>()[1] = 1e300;  // inf once rounded to float32
    for (auto& [name, view] : sd)
        if (name == "sinks") view = bad_sinks.view();
    try {
        m.load_state_dict(sd);
        ADD_FAILURE() << "a sink of 1e300 (inf in float32) was accepted";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("state_dict: tensor 'sinks': values must be finite but entry 1 is inf"),
                  std::string::npos) << e.what();
    }
    EXPECT_EQ(m.parameter("sinks").data_as<float>()[1], 0.0f);  // unchanged

    m.parameter("sinks").data_as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    KVCacheConfig kc;
    kc.kv_heads = 2;
    kc.head_dim = 2;
    kc.capacity = 1;
    kc.grow = true;
    KVCache cache(kc);
    const void* storage = cache.keys().data();
    Tensor x(DType::f32, Shape{2, 4}, true);  // two new tokens: the cache would grow
    try {
        (void)m.forward_incremental(x.view(), cache);
        ADD_FAILURE() << "a NaN sink was accepted";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("MultiHeadAttention: forward_incremental: parameter 'sinks': values must be "
                                             "finite but entry 0 is nan"),
                  std::string::npos) << e.what();
    }
    EXPECT_EQ(cache.capacity(), 1);
    EXPECT_EQ(cache.keys().data(), storage);
    EXPECT_EQ(cache.length(0), 0);
}

}  // namespace
