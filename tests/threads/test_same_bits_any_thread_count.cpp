// Results do not depend on the thread count (include/attn/threads.hpp, docs/environment.md):
// every public call that computes gives, on 2, 3, 5 and 8 threads, the bits it gives on 1 —
// through the public API and its thread setting (ScopedNumThreads, what the CLI's --threads
// and Python's threads= use), on the shapes that take each split: flash's key chunks, its query
// groups, the backward's chunks of key blocks with their dQ partials, decode's split-KV, varlen's
// head-major and across-sequences paths, the MHA layer's GEMM grids; with dropout wherever a
// call takes it (the keep mask must not move with the threads either). The kernel tests check
// 1 against 2 threads; odd counts and more threads than CPUs are what a split computed from
// the thread count would get wrong while still agreeing at 1 and 2.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"
#include "decode_on_caches.hpp"
#include "mha/mha_test_util.hpp"

namespace {

using namespace attn;
using test::bit_equal;
using test::randn;

// A vector of move-only tensors (an initializer list would copy them).
template <class... T>
std::vector<Tensor> tensors(T&&... t) {
    std::vector<Tensor> all;
    (all.push_back(std::forward<T>(t)), ...);
    return all;
}

// Runs `compute` on 1 thread, then on 2, 3, 5 and 8, and expects every output's bits unchanged.
void expect_same_bits_on_any_thread_count(const std::function<std::vector<Tensor>()>& compute) {
    std::vector<Tensor> one;
    {
        const ScopedNumThreads threads(1);
        one = compute();
    }
    for (int n : {2, 3, 5, 8}) {
        const ScopedNumThreads threads(n);
        const std::vector<Tensor> got = compute();
        ASSERT_EQ(got.size(), one.size());
        for (std::size_t i = 0; i < got.size(); ++i)
            EXPECT_TRUE(bit_equal(got[i], one[i])) << "output " << i << " differs between 1 and " << n << " threads";
    }
}

struct Attention {
    std::int64_t B, Hq, Hkv, Lq, Lk, D;
    Causal causal;
    double dropout;
    DType dtype;
};

// sdpa (out, lse) then sdpa_backward (dq, dk, dv) on float32 gradients.
std::vector<Tensor> forward_backward(const Attention& a, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
    SdpaOptions opt;
    opt.causal = a.causal;
    opt.dropout_p = a.dropout;
    opt.dropout_seed = 0x5eed;
    Tensor out(a.dtype, Shape{a.B, a.Hq, a.Lq, a.D}), lse(DType::f32, Shape{a.B, a.Hq, a.Lq});
    const TensorView lv = lse.view();
    sdpa(q, k, v, opt, out, &lv);
    Tensor dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv(DType::f32, v.shape());
    sdpa_backward(q, k, v, out, lse, dout, opt, dq, dk, dv);
    return tensors(std::move(out), std::move(lse), std::move(dq), std::move(dk), std::move(dv));
}

TEST(SameBitsAnyThreadCount, SdpaForwardAndBackward) {
    for (const Attention& a : {
             // GQA, bottom-right causal, dropout: several tasks per head.
             Attention{2, 4, 2, 300, 257, 40, Causal::bottom_right, 0.2, DType::f32},
             // One (batch, head) of 64 queries against 4096 keys: the forward splits the keys
             // into chunks merged per task, the backward cuts them into chunks with dQ partials.
             Attention{1, 1, 1, 64, 4096, 64, Causal::none, 0.1, DType::f32},
             // A head's K/V past 1 MiB with 8 query blocks: the forward groups query blocks.
             Attention{1, 2, 2, 512, 2200, 64, Causal::top_left, 0.0, DType::f32},
             // bfloat16 in and out.
             Attention{1, 4, 4, 200, 300, 64, Causal::top_left, 0.3, DType::bf16},
         }) {
        SCOPED_TRACE("B " + std::to_string(a.B) + " Hq " + std::to_string(a.Hq) + " Lq " + std::to_string(a.Lq) + " Lk " +
                     std::to_string(a.Lk));
        std::mt19937_64 rng(3);
        const Tensor q = randn(a.dtype, Shape{a.B, a.Hq, a.Lq, a.D}, rng), k = randn(a.dtype, Shape{a.B, a.Hkv, a.Lk, a.D}, rng),
                     v = randn(a.dtype, Shape{a.B, a.Hkv, a.Lk, a.D}, rng), dout = randn(DType::f32, Shape{a.B, a.Hq, a.Lq, a.D}, rng);
        expect_same_bits_on_any_thread_count([&] { return forward_backward(a, q, k, v, dout); });
    }
}

TEST(SameBitsAnyThreadCount, DecodeOnContiguousAndPagedCaches) {
    const test::DecodeOnCaches decode(5);
    expect_same_bits_on_any_thread_count([&] { return decode(); });
}

TEST(SameBitsAnyThreadCount, VarlenForwardAndBackwardWithDropout) {
    // A long sequence (head-major copies), a few-queries-many-keys one (key chunks alone), and
    // short ones (run side by side across sequences).
    const std::vector<std::int32_t> lq = {300, 64, 5, 37, 1}, lk = {300, 2048, 5, 40, 90};
    std::vector<std::int32_t> cq = {0}, ck = {0};
    for (std::size_t b = 0; b < lq.size(); ++b) cq.push_back(cq.back() + lq[b]), ck.push_back(ck.back() + lk[b]);
    const std::int64_t N = static_cast<std::int64_t>(lq.size()), Tq = cq.back(), Tk = ck.back(), Hq = 4, Hkv = 2, D = 64;
    Tensor cu_q(DType::i32, Shape{N + 1}), cu_k(DType::i32, Shape{N + 1});
    std::memcpy(cu_q.data(), cq.data(), cu_q.nbytes());
    std::memcpy(cu_k.data(), ck.data(), cu_k.nbytes());
    std::mt19937_64 rng(7);
    const Tensor q = randn(DType::f32, Shape{Tq, Hq, D}, rng), k = randn(DType::f32, Shape{Tk, Hkv, D}, rng),
                 v = randn(DType::f32, Shape{Tk, Hkv, D}, rng), dout = randn(DType::f32, Shape{Tq, Hq, D}, rng);
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    opt.dropout_p = 0.2;
    opt.dropout_seed = 11;
    expect_same_bits_on_any_thread_count([&] {
        Tensor out(DType::f32, q.shape()), lse(DType::f32, Shape{Tq, Hq});
        const TensorView lv = lse.view();
        sdpa_varlen(q, k, v, cu_q, cu_k, opt, out, &lv);
        Tensor dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv(DType::f32, v.shape());
        sdpa_varlen_backward(q, k, v, cu_q, cu_k, out, lse, dout, opt, dq, dk, dv);
        return tensors(std::move(out), std::move(lse), std::move(dq), std::move(dk), std::move(dv));
    });
}

// Every gradient of a forward_train + backward, parameters first (in their order), then the inputs'.
std::vector<Tensor> gradients(MhaGradients g) {
    std::vector<Tensor> all;
    for (auto& [name, t] : g.params) all.push_back(std::move(t));
    for (Tensor* t : {&g.query, &g.key, &g.value})
        if (t->data() != nullptr) all.push_back(std::move(*t));
    return all;
}

TEST(SameBitsAnyThreadCount, MhaLayerForwardAndTraining) {
    // 400 rows: the projection GEMMs split rows on few threads and rows × columns on more; the
    // weight gradients sum over all 400 rows (the GEMM's K).
    std::mt19937 rng(9);
    MultiHeadAttention m(MhaConfig{.embed_dim = 128, .num_heads = 4, .num_kv_heads = 2, .batch_first = true});
    mha_test::randomise(m, rng);
    const Tensor x = mha_test::random_tensor(Shape{2, 200, 128}, rng), dy = mha_test::random_tensor(Shape{2, 200, 128}, rng);
    MhaForwardOptions causal;
    causal.causal = attn::Causal::top_left;
    expect_same_bits_on_any_thread_count([&] {
        MhaOutput y = m.forward(x, x, x, causal);
        MhaForwardState state;
        Tensor yt = m.forward_train(x, x, x, causal, MhaTrainOptions{0.25, 21}, state);
        std::vector<Tensor> all = gradients(m.backward(state, dy));
        all.push_back(std::move(y.output));
        all.push_back(std::move(y.weights));
        all.push_back(std::move(yt));
        return all;
    });
}

TEST(SameBitsAnyThreadCount, MhaLayerPackedTraining) {
    std::mt19937 rng(13);
    MultiHeadAttention m(MhaConfig{.embed_dim = 64, .num_heads = 4});
    mha_test::randomise(m, rng);
    const std::vector<std::int32_t> cu = {0, 300, 303, 380};
    Tensor cu_t(DType::i32, Shape{4});
    std::memcpy(cu_t.data(), cu.data(), cu_t.nbytes());
    const Tensor x = mha_test::random_tensor(Shape{380, 64}, rng), dy = mha_test::random_tensor(Shape{380, 64}, rng);
    MhaPackedOptions causal;
    causal.causal = Causal::top_left;
    expect_same_bits_on_any_thread_count([&] {
        MhaForwardState state;
        Tensor y = m.forward_packed_train(x, x, x, cu_t, cu_t, causal, MhaTrainOptions{0.1, 5}, state);
        std::vector<Tensor> all = gradients(m.backward(state, dy));
        all.push_back(std::move(y));
        return all;
    });
}

}  // namespace
