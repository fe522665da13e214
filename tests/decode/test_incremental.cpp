// Generation through the cache equals one causal attention over the whole sequence:
// sequences of different prompt lengths in one batch, steps of 1..16 new tokens, and a
// rejected speculative block rolled back with truncate(). This is the contract an
// incremental MultiHeadAttention (forward_incremental) builds on.
#include <algorithm>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "decode_util.hpp"

namespace attn::test {
namespace {

// fp32: the bound. 16-bit storage: the same bound against attention over the same
// rounded K/V (the cache's rounding is the only difference from fp32, and it is bounded
// separately in test_decode_kernel.cpp).
constexpr double kTokenTol = 1e-5;

// A contiguous (1, H, n, D) copy of positions [t0, t0+n) of x (H, N, D).
Tensor rows(const Tensor& x, std::int64_t t0, std::int64_t n) {
    const std::int64_t H = x.shape()[0], N = x.shape()[1], D = x.shape()[2];
    Tensor out(x.dtype(), Shape{H, n, D});
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t d = 0; d < D; ++d)
                out.data_as<float>()[(h * n + t) * D + d] = x.data_as<float>()[(h * N + t0 + t) * D + d];
    return out;
}

TensorView as4(const Tensor& x) {  // (H, N, D) → (1, H, N, D)
    return TensorView(x.data(), x.dtype(), Shape{1, x.shape()[0], x.shape()[1], x.shape()[2]});
}

void run_generation(DType storage) {
    std::mt19937 rng(42 + static_cast<int>(storage));
    const std::int64_t B = 3, Hkv = 2, G = 3, Hq = Hkv * G, Dk = 32, Dv = 24;
    const std::vector<std::int64_t> prompt{9, 2, 14};
    const std::vector<std::int64_t> steps{1, 1, 4, 1, 3, 16, 2};  // 28 generated tokens
    std::int64_t generated = 0;
    for (auto s : steps) generated += s;

    // Per sequence: the whole sequence's Q, K, V (H, N_b, D), and the full causal answer.
    std::vector<Tensor> Q, K, V, K_used, V_used, O_ref;
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t N = prompt[static_cast<std::size_t>(b)] + generated;
        Q.push_back(random_f32(Shape{Hq, N, Dk}, rng));
        K.push_back(random_f32(Shape{Hkv, N, Dk}, rng));
        V.push_back(random_f32(Shape{Hkv, N, Dv}, rng));
        // The reference sees K/V exactly as the cache stores them.
        const Tensor k16 = to_storage(K.back(), storage), v16 = to_storage(V.back(), storage);
        K_used.push_back(to_dtype(k16, DType::f32));
        V_used.push_back(to_dtype(v16, DType::f32));
        O_ref.emplace_back(DType::f32, Shape{1, Hq, N, Dv});
        SdpaOptions opt;
        opt.causal = Causal::top_left;  // Lq = Lk: both alignments coincide
        opt.impl = Impl::reference;
        sdpa(as4(Q.back()), as4(K_used.back()), as4(V_used.back()), opt, O_ref.back());
    }

    KVCacheConfig cfg;
    cfg.batch = B;
    cfg.kv_heads = Hkv;
    cfg.head_dim = Dk;
    cfg.value_dim = Dv;
    cfg.capacity = 8;  // small on purpose: the prompt and the steps make it grow
    cfg.storage = storage;
    cfg.grow = true;
    KVCache cache(cfg);
    // Prompts of different lengths, one sequence at a time (their outputs come from a
    // prefill kernel; here only the cache contents matter).
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t P = prompt[static_cast<std::size_t>(b)];
        cache.append(b, rows(K[b], 0, P), rows(V[b], 0, P));
    }

    double worst = 0;
    int compared_steps = 0;
    for (std::size_t s = 0; s < steps.size(); ++s) {
        const std::int64_t Lq = steps[s];
        if (s == 2) {
            // A speculative block of 3 draft tokens that the verifier rejects: attend with
            // them, then roll every sequence back. Later steps must not see them.
            const std::vector<std::int64_t> before = cache.lengths();
            const Tensor kd = random_f32(Shape{B, Hkv, 3, Dk}, rng), vd = random_f32(Shape{B, Hkv, 3, Dv}, rng);
            cache.append(kd, vd);
            Tensor qd = random_f32(Shape{B, Hq, 3, Dk}, rng), od(DType::f32, Shape{B, Hq, 3, Dv});
            decode_attention(qd, cache, causal_bottom_right(), od);
            for (std::int64_t b = 0; b < B; ++b) cache.truncate(b, before[static_cast<std::size_t>(b)]);
        }
        Tensor q(DType::f32, Shape{B, Hq, Lq, Dk}), out(DType::f32, Shape{B, Hq, Lq, Dv});
        std::vector<std::int64_t> pos(B);
        for (std::int64_t b = 0; b < B; ++b) {
            pos[b] = cache.length(b);
            cache.append(b, rows(K[b], pos[b], Lq), rows(V[b], pos[b], Lq));
            const Tensor qb = rows(Q[b], pos[b], Lq);
            std::copy(qb.data_as<float>(), qb.data_as<float>() + qb.numel(), q.data_as<float>() + b * Hq * Lq * Dk);
        }
        poison(out);
        decode_attention(q, cache, causal_bottom_right(), out);
        for (std::int64_t b = 0; b < B; ++b) {
            const std::int64_t N = O_ref[b].shape()[2];
            for (std::int64_t h = 0; h < Hq; ++h)
                for (std::int64_t i = 0; i < Lq; ++i)
                    for (std::int64_t d = 0; d < Dv; ++d) {
                        const float got = out.data_as<float>()[((b * Hq + h) * Lq + i) * Dv + d];
                        const float want = O_ref[b].data_as<float>()[(h * N + pos[b] + i) * Dv + d];
                        const double e = std::fabs(double(got) - want);
                        ASSERT_LE(e, kTokenTol) << dtype_name(storage) << " step " << s << " b=" << b << " h=" << h
                                                << " token " << pos[b] + i;
                        worst = std::max(worst, e);
                    }
        }
        ++compared_steps;
    }
    for (std::int64_t b = 0; b < B; ++b) EXPECT_EQ(cache.length(b), prompt[static_cast<std::size_t>(b)] + generated);
    EXPECT_GE(cache.capacity(), 14 + generated);
    std::printf("[decode] token-by-token (%s cache): %d steps, max |err| vs full causal %.3g\n",
                std::string(dtype_name(storage)).c_str(), compared_steps, worst);
}

TEST(Incremental, TokenByTokenEqualsFullCausalF32) { run_generation(DType::f32); }
TEST(Incremental, TokenByTokenEqualsFullCausalF16) { run_generation(DType::f16); }
TEST(Incremental, TokenByTokenEqualsFullCausalBF16) { run_generation(DType::bf16); }

// A sliding window over the cache, and non-causal use (every query sees the whole cache),
// against sdpa's reference on the same K/V with the same rules (equal lengths, so the
// per-sequence alignment is sdpa's bottom-right).
TEST(Incremental, WindowAndNonCausalMatchSdpa) {
    std::mt19937 rng(8);
    const std::int64_t B = 2, Hkv = 1, Hq = 4, L = 100, Lq = 5, D = 16;
    KVCacheConfig cfg;
    cfg.batch = B;
    cfg.kv_heads = Hkv;
    cfg.head_dim = D;
    cfg.capacity = L;
    KVCache cache(cfg);
    const Tensor k = random_f32(Shape{B, Hkv, L, D}, rng), v = random_f32(Shape{B, Hkv, L, D}, rng);
    cache.append(k, v);
    const Tensor q = random_f32(Shape{B, Hq, Lq, D}, rng);
    for (int mode = 0; mode < 3; ++mode) {
        // The same options through both entry points: one problem, one answer.
        SdpaOptions sopt;
        if (mode != 0) sopt.causal = Causal::bottom_right;
        if (mode == 2) {
            sopt.window.left = 7;
            sopt.window.align = Align::bottom_right;
        }
        SdpaOptions dopt = sopt;
        sopt.impl = Impl::reference;
        Tensor got(DType::f32, Shape{B, Hq, Lq, D}), want(DType::f32, Shape{B, Hq, Lq, D});
        Tensor lg(DType::f32, Shape{B, Hq, Lq}), lw(DType::f32, Shape{B, Hq, Lq});
        TensorView lgv = lg.view(), lwv = lw.view();
        poison(got);
        poison(lg);
        decode_attention(q, cache, dopt, got, &lgv);
        sdpa(q, k, v, sopt, want, &lwv);
        EXPECT_EQ(compare(got, want, kTokenTol, 0).bad, 0) << "mode " << mode;
        EXPECT_EQ(compare(lg, lw, kTokenTol, 1e-6).bad, 0) << "mode " << mode;
    }
}

}  // namespace
}  // namespace attn::test

namespace attn::test {
namespace {

// What an MHA layer passes: Q and the output as (B, L, H, D) projection buffers seen
// through transpose(1, 2). Same arithmetic as contiguous views, so the same bits.
TEST(Incremental, StridedQueryAndOutputViews) {
    std::mt19937 rng(9);
    const std::int64_t B = 2, Hkv = 2, Hq = 4, L = 70, Lq = 3, D = 40;
    KVCacheConfig cfg;
    cfg.batch = B;
    cfg.kv_heads = Hkv;
    cfg.head_dim = D;
    cfg.capacity = L;
    cfg.storage = DType::bf16;
    KVCache cache(cfg);
    cache.append(random_f32(Shape{B, Hkv, L, D}, rng), random_f32(Shape{B, Hkv, L, D}, rng));
    const Tensor q_blhd = random_f32(Shape{B, Lq, Hq, D}, rng);
    Tensor q(DType::f32, Shape{B, Hq, Lq, D});
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < Lq; ++i)
                for (std::int64_t d = 0; d < D; ++d)
                    q.data_as<float>()[((b * Hq + h) * Lq + i) * D + d] = q_blhd.data_as<float>()[((b * Lq + i) * Hq + h) * D + d];
    Tensor out(DType::f32, Shape{B, Hq, Lq, D}), out_blhd(DType::f32, Shape{B, Lq, Hq, D});
    poison(out);
    poison(out_blhd);
    decode_attention(q, cache, causal_bottom_right(), out);
    decode_attention(q_blhd.view().transpose(1, 2), cache, causal_bottom_right(), out_blhd.view().transpose(1, 2));
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < Lq; ++i)
                for (std::int64_t d = 0; d < D; ++d)
                    ASSERT_EQ(out.data_as<float>()[((b * Hq + h) * Lq + i) * D + d],
                              out_blhd.data_as<float>()[((b * Lq + i) * Hq + h) * D + d]);
}

}  // namespace
}  // namespace attn::test
