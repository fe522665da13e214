// MultiHeadAttention::forward_into checks its attention call before the input projections (and
// forward_incremental_into its cache and sinks before its QKV projection): sdpa
// refused such a call (impl = decode for 20 queries, a sink edited to inf in place, an Impl cast
// from a wrong integer) only after the projection GEMMs had run for nothing. The message is
// sdpa's, word for word; the output stays poisoned and the workspace holds no projection (its
// buffer was never made: time-independent evidence that no GEMM ran).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/interrupt.hpp"
#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/mha_incremental.hpp"
#include "mha_test_util.hpp"

namespace {

using namespace attn;
using attn::mha_test::message;
using attn::mha_test::random_tensor;
using attn::mha_test::randomise;
using attn::test::poisoned;
using attn::test::still_poisoned;

constexpr std::int64_t E = 16;

// forward_into(x, x, x) with a fresh workspace: the message, and whether anything was touched.
void expect_refused_before_projecting(const MultiHeadAttention& m, const Tensor& x, const MhaForwardOptions& o,
                                      const std::string& want) {
    const Tensor out = poisoned(DType::f32, x.shape());
    const Tensor weights = poisoned(DType::f32, m.weights_shape(x, x, o.average_attn_weights));
    const TensorView wv = weights.view();
    MhaWorkspace ws;
    EXPECT_EQ(message([&] { m.forward_into(x, x, x, o, out, o.need_weights ? &wv : nullptr, &ws); }), want);
    EXPECT_TRUE(still_poisoned(out));
    EXPECT_TRUE(still_poisoned(weights));
    EXPECT_EQ(ws.proj_q.data(), nullptr) << "the input projection ran before the refusal";
}

TEST(MhaChecksFirst, TheAttentionCallIsCheckedBeforeTheProjections) {
    std::mt19937 rng(3);
    MultiHeadAttention m(MhaConfig{.embed_dim = E, .num_heads = 2});
    randomise(m, rng);
    MhaForwardOptions o;
    o.need_weights = false;
    o.impl = Impl::decode;
    expect_refused_before_projecting(m, random_tensor(Shape{20, 1, E}, rng), o,
                                     "sdpa: impl: the decode kernel cannot run this call: Lq = 20 > 16 (decode is "
                                     "for a few new queries)");
    o.need_weights = true;
    expect_refused_before_projecting(m, random_tensor(Shape{3, 2, E}, rng), o,
                                     "sdpa: impl: the decode kernel cannot run this call: attention weights were "
                                     "requested (decode never forms them)");
    o.need_weights = false;
    o.impl = static_cast<Impl>(9);
    expect_refused_before_projecting(m, random_tensor(Shape{3, 2, E}, rng), o,
                                     "sdpa: impl: must be one of Impl::automatic, reference, flash, decode but got the "
                                     "value 9");
}

TEST(MhaChecksFirst, ASinkEditedInPlaceIsRefusedBeforeTheProjections) {
    std::mt19937 rng(4);
    MultiHeadAttention m(MhaConfig{.embed_dim = E, .num_heads = 2, .sinks = true});
    randomise(m, rng);
    m.parameter("sinks").data_as<float>()[1] = std::numeric_limits<float>::infinity();  // load_state_dict refuses it
    MhaForwardOptions o;
    expect_refused_before_projecting(m, random_tensor(Shape{3, 2, E}, rng), o,
                                     "sdpa: sinks: values must be finite but entry 1 is inf");
}

}  // namespace

// forward_incremental_into: a cache the tokens do not fit in, or a sink edited in place, was
// refused after the QKV projection (the append's check, the sink's just before the append).
TEST(MhaChecksFirst, IncrementalRefusesBeforeTheProjection) {
    std::mt19937 rng(5);
    MultiHeadAttention m(MhaConfig{.embed_dim = E, .num_heads = 2, .sinks = true});
    randomise(m, rng);
    KVCacheConfig kc;
    kc.batch = 2;
    kc.kv_heads = 2;
    kc.head_dim = kc.value_dim = E / 2;
    kc.capacity = 4;
    KVCache cache(kc);
    const Tensor x = random_tensor(Shape{5, 2, E}, rng);  // 5 tokens: more than the 4 positions
    const auto expect_refused = [&](const std::string& want) {
        const Tensor out = poisoned(DType::f32, x.shape());
        MhaWorkspace ws;
        EXPECT_EQ(message([&] { m.forward_incremental_into(x, cache, out, &ws); }), want);
        EXPECT_TRUE(still_poisoned(out));
        EXPECT_EQ(ws.proj_q.data(), nullptr) << "the QKV projection ran before the refusal";
        EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{0, 0}));
    };
    expect_refused("KVCache: append: sequence 0 holds 0 of 4 positions; 5 more need 5 (nothing was written; enable "
                   "growth, reserve() more, or truncate first)");
    cache.reserve(8);
    m.parameter("sinks").data_as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    expect_refused("MultiHeadAttention: forward_incremental: parameter 'sinks': values must be finite but entry 0 is nan");
}

// forward_packed and forward_packed_train check their sdpa_varlen call before the projections: a
// refused call (impl = decode for a sequence of 20 queries, cu_seqlens that do not add up,
// decode with dropout) ran the three input GEMMs first. The caller's interrupt flag is set: a
// GEMM reads it before each block and, having seen it, throws attn::Interrupted — so sdpa_varlen's
// own error, word for word, is time-independent evidence that no GEMM ran before the refusal.
TEST(MhaChecksFirst, PackedChecksTheAttentionCallBeforeTheProjections) {
    std::mt19937 rng(6);
    MultiHeadAttention m(MhaConfig{.embed_dim = E, .num_heads = 2});
    randomise(m, rng);
    const Tensor x = random_tensor(Shape{23, E}, rng);  // two sequences: 3 and 20 tokens
    const auto offsets = [](std::vector<std::int64_t> v) {
        Tensor t(DType::i64, Shape{static_cast<std::int64_t>(v.size())});
        for (std::size_t i = 0; i < v.size(); ++i) t.data_as<std::int64_t>()[i] = v[i];
        return t;
    };
    const Tensor cu = offsets({0, 3, 23}), cu_short = offsets({0, 3, 22}), cu3 = offsets({0, 3});
    const auto what = [](const std::function<void()>& f) -> std::string {
        try {
            f();
        } catch (const std::exception& e) {
            return e.what();
        }
        return "no error";
    };
    std::atomic<bool> stop{true};
    const ScopedInterruptFlag watch(stop);
    MhaPackedOptions o;
    o.impl = Impl::decode;
    EXPECT_EQ(what([&] { (void)m.forward_packed(x, x, x, cu, cu, o); }),
              "sdpa_varlen: impl: the decode kernel cannot run sequence 1: Lq = 20 > 16 (decode is for a few new queries)");
    o.impl = Impl::automatic;
    EXPECT_EQ(what([&] { (void)m.forward_packed(x, x, x, cu_short, cu, o); }),
              "sdpa_varlen: cu_seqlens_q: last entry must equal q's token count 23 but got 22 (every packed token "
              "belongs to one sequence)");
    o.impl = Impl::decode;
    const Tensor x3 = random_tensor(Shape{3, E}, rng);
    MhaTrainOptions t;
    t.dropout_p = 0.25;
    t.dropout_seed = 1;
    MhaForwardState state;
    EXPECT_EQ(what([&] { (void)m.forward_packed_train(x3, x3, x3, cu3, cu3, o, t, state); }),
              "sdpa_varlen: impl: the decode kernel cannot run this call: dropout was requested (decode applies none)");
    EXPECT_EQ(state.q.data(), nullptr) << "a refused call filled the training state";
    // The flag is read by the GEMMs indeed: an accepted call throws attn::Interrupted.
    EXPECT_EQ(what([&] { (void)m.forward_packed(x3, x3, x3, cu3, cu3, o); }).rfind("interrupted", 0), 0u);
}
