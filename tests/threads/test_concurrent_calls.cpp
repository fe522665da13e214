// Calls from several threads at once, as a server makes them: the headers allow const calls to
// run concurrently (include/attn/kv_cache.hpp, paged_kv_cache.hpp, mha.hpp), and calls on
// unrelated objects always. Two caller threads, each with its own OpenMP team of two, make the
// same calls at the same moment and must get the bits one caller alone gets. In the
// ThreadSanitizer build (docs/build.md) this is where state that calls share without ordering
// (a kept buffer, a lazily made table, a per-thread setting read by another thread) is reported;
// elsewhere it checks the results.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"
#include "decode_on_caches.hpp"
#include "mha/mha_test_util.hpp"

namespace {

using namespace attn;
using test::bit_equal;
using test::randn;

constexpr int kCallers = 2;

// `compute` on kCallers threads started together (each on 2 OpenMP threads), then alone on this
// thread: every caller's outputs must equal the lone call's, bit for bit.
void expect_same_bits_when_called_at_once(const std::function<std::vector<Tensor>()>& compute) {
    std::vector<std::vector<Tensor>> got(kCallers);
    std::vector<std::exception_ptr> error(kCallers);
    std::atomic<int> waiting{kCallers};
    std::vector<std::thread> callers;
    for (int c = 0; c < kCallers; ++c) {
        callers.emplace_back([&, c] {
            const ScopedNumThreads threads(2);
            waiting.fetch_sub(1);
            while (waiting.load() > 0) std::this_thread::yield();  // start together
            try {
                got[c] = compute();
            } catch (...) {
                error[c] = std::current_exception();
            }
        });
    }
    for (std::thread& t : callers) t.join();
    for (const std::exception_ptr& e : error)
        if (e) std::rethrow_exception(e);
    std::vector<Tensor> alone;
    {
        const ScopedNumThreads threads(2);
        alone = compute();
    }
    for (int c = 0; c < kCallers; ++c) {
        ASSERT_EQ(got[c].size(), alone.size());
        for (std::size_t i = 0; i < alone.size(); ++i)
            EXPECT_TRUE(bit_equal(got[c][i], alone[i])) << "caller " << c << ", output " << i;
    }
}

TEST(ConcurrentCalls, DecodeOnSharedCaches) {
    const test::DecodeOnCaches decode(11);
    expect_same_bits_when_called_at_once([&] { return decode(); });
}

TEST(ConcurrentCalls, EachCallerGrowsItsOwnCache) {
    // Each caller's cache starts at 8 positions and doubles while a generation loop appends a
    // token and decodes against it: growth on one thread while another grows and computes.
    const std::int64_t Hq = 4, Hkv = 2, D = 32, steps = 40;
    std::mt19937_64 rng(13);
    const Tensor q = randn(DType::bf16, Shape{1, Hq, 1, D}, rng);
    const Tensor k = randn(DType::bf16, Shape{Hkv, steps, D}, rng), v = randn(DType::bf16, Shape{Hkv, steps, D}, rng);
    expect_same_bits_when_called_at_once([&] {
        KVCache cache(KVCacheConfig{.kv_heads = Hkv, .head_dim = D, .capacity = 8, .storage = DType::bf16, .grow = true});
        std::vector<Tensor> all;
        for (std::int64_t t = 0; t < steps; ++t) {
            cache.append(0, k.view().slice(1, t, 1), v.view().slice(1, t, 1));
            Tensor out(DType::f32, Shape{1, Hq, 1, D});
            decode_attention(q, cache, SdpaOptions{}, out);
            all.push_back(std::move(out));
        }
        return all;
    });
}

TEST(ConcurrentCalls, SdpaAndTheLayerOnSharedInputs) {
    // The forward splits 4096 keys into chunks, the backward into chunks with dQ partials; the
    // layer's projections run the GEMM with its per-thread workspaces.
    std::mt19937_64 rng(17);
    const Tensor q = randn(DType::f32, Shape{1, 2, 64, 64}, rng), k = randn(DType::f32, Shape{1, 2, 4096, 64}, rng),
                 v = randn(DType::f32, Shape{1, 2, 4096, 64}, rng), dout = randn(DType::f32, Shape{1, 2, 64, 64}, rng);
    std::mt19937 mrng(19);
    MultiHeadAttention layer(MhaConfig{.embed_dim = 128, .num_heads = 4, .num_kv_heads = 2, .batch_first = true});
    mha_test::randomise(layer, mrng);
    const Tensor x = mha_test::random_tensor(Shape{2, 100, 128}, mrng);
    expect_same_bits_when_called_at_once([&] {
        std::vector<Tensor> all;
        Tensor out(DType::f32, q.shape()), lse(DType::f32, Shape{1, 2, 64});
        const TensorView lv = lse.view();
        sdpa(q, k, v, SdpaOptions{}, out, &lv);
        Tensor dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv(DType::f32, v.shape());
        sdpa_backward(q, k, v, out, lse, dout, SdpaOptions{}, dq, dk, dv);
        MhaOutput y = layer.forward(x, x, x, MhaForwardOptions{});
        for (Tensor* t : {&out, &lse, &dq, &dk, &dv, &y.output, &y.weights}) all.push_back(std::move(*t));
        return all;
    });
}

}  // namespace
