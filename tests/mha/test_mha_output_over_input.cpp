// One rule for a MultiHeadAttention output over its inputs (docs/conventions.md,
// "MultiHeadAttention"): exactly the input (the layer in place) or no shared memory at all.
// forward_into refused an output that was its query, while forward_incremental_into took an
// output over x_new however it overlapped; both were safe (the inputs are read only by the input
// projections, before the output is written), but the two entry points had two rules.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/mha_incremental.hpp"
#include "mha_test_util.hpp"

namespace {

using namespace attn;
using attn::mha_test::message;
using attn::mha_test::random_tensor;
using attn::mha_test::randomise;

constexpr std::int64_t E = 16, B = 2, L = 5;

MultiHeadAttention layer(std::mt19937& rng) {
    MultiHeadAttention m(MhaConfig{.embed_dim = E, .num_heads = 2});
    randomise(m, rng);
    return m;
}

bool same_bytes(const Tensor& a, const void* b) { return std::memcmp(a.data(), b, a.nbytes()) == 0; }

TEST(MhaOutputOverInput, ForwardIntoMayWriteOverItsQueryExactly) {
    std::mt19937 rng(7);
    const MultiHeadAttention m = layer(rng);
    MhaForwardOptions o;
    o.need_weights = false;
    const Tensor x = random_tensor(Shape{L, B, E}, rng);
    const Tensor want = m.forward(x, x, x, o).output;  // into its own memory
    Tensor y(DType::f32, x.shape());
    std::memcpy(y.data(), x.data(), x.nbytes());
    m.forward_into(y, y, y, o, y, nullptr);  // self-attention in place
    EXPECT_TRUE(same_bytes(want, y.data()));
    // Cross-attention: the output over the query, the key apart.
    const Tensor kv = random_tensor(Shape{L + 2, B, E}, rng);
    const Tensor want_cross = m.forward(x, kv, kv, o).output;
    std::memcpy(y.data(), x.data(), x.nbytes());
    m.forward_into(y, kv, kv, o, y, nullptr);
    EXPECT_TRUE(same_bytes(want_cross, y.data()));
}

TEST(MhaOutputOverInput, ForwardIntoRefusesAPartialOverlapBeforeWriting) {
    std::mt19937 rng(8);
    const MultiHeadAttention m = layer(rng);
    MhaForwardOptions o;
    o.need_weights = false;
    const Tensor buffer = random_tensor(Shape{L * B * E + 1}, rng);
    const Tensor before = random_tensor(Shape{L * B * E + 1}, rng);
    std::memcpy(before.data(), buffer.data(), buffer.nbytes());
    const TensorView query(buffer.data(), DType::f32, Shape{L, B, E});
    const TensorView shifted(buffer.data_as<float>() + 1, DType::f32, Shape{L, B, E});  // one element on
    EXPECT_EQ(message([&] { m.forward_into(query, query, query, o, shifted, nullptr); }),
              "MultiHeadAttention: output: must share no memory with query or be exactly query (the same data, dtype, "
              "shape and strides: the layer in place) but it overlaps query otherwise");
    EXPECT_TRUE(same_bytes(before, buffer.data()));
    // A float16 output over a float32 query's bytes is no in-place layer either.
    const TensorView half_over(buffer.data(), DType::f16, Shape{L, B, E});
    EXPECT_EQ(message([&] { m.forward_into(query, query, query, o, half_over, nullptr); }).substr(0, 58),
              "MultiHeadAttention: output: must share no memory with quer");
    EXPECT_TRUE(same_bytes(before, buffer.data()));
}

KVCache cache_for(const MultiHeadAttention& m) {
    KVCacheConfig c;
    c.batch = B;
    c.kv_heads = m.config().num_heads;
    c.head_dim = c.value_dim = m.head_dim();
    c.capacity = 16;
    return KVCache(c);
}

TEST(MhaOutputOverInput, IncrementalMayWriteOverItsInputExactly) {
    std::mt19937 rng(9);
    const MultiHeadAttention m = layer(rng);
    const Tensor x = random_tensor(Shape{L, B, E}, rng);
    KVCache apart = cache_for(m), in_place = cache_for(m);
    const Tensor want = m.forward_incremental(x, apart);
    Tensor y(DType::f32, x.shape());
    std::memcpy(y.data(), x.data(), x.nbytes());
    m.forward_incremental_into(y, in_place, y);
    EXPECT_TRUE(same_bytes(want, y.data()));
    EXPECT_EQ(in_place.lengths(), apart.lengths());
}

TEST(MhaOutputOverInput, IncrementalRefusesAPartialOverlapBeforeWriting) {
    std::mt19937 rng(10);
    const MultiHeadAttention m = layer(rng);
    KVCache cache = cache_for(m);
    const Tensor buffer = random_tensor(Shape{L * B * E + 1}, rng);
    const Tensor before = random_tensor(Shape{L * B * E + 1}, rng);
    std::memcpy(before.data(), buffer.data(), buffer.nbytes());
    const TensorView x_new(buffer.data(), DType::f32, Shape{L, B, E});
    const TensorView shifted(buffer.data_as<float>() + 1, DType::f32, Shape{L, B, E});
    EXPECT_EQ(message([&] { m.forward_incremental_into(x_new, cache, shifted); }),
              "MultiHeadAttention: forward_incremental: output: must share no memory with x_new or be exactly x_new (the "
              "same data, dtype, shape and strides: the layer in place) but it overlaps x_new otherwise");
    EXPECT_TRUE(same_bytes(before, buffer.data()));
    EXPECT_EQ(cache.length(0), 0);
    EXPECT_EQ(cache.length(1), 0);
}

}  // namespace
