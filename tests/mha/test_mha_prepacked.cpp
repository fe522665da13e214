// MultiHeadAttention::pack_weights (src/mha/packed_weights.cpp): the projection GEMM reads
// weight panels packed once instead of packing the weights on every call. The packed layer's
// inference outputs must be bit-identical to the unpacked layer's (same panels, same kernel)
// on every kernel-table row, 1 and 2 threads; load_state_dict and set_param_dtype re-pack (the
// output follows the new weights); the training paths read the parameters; a packed copy made
// on another ISA row is not used. And the panels are really used: a write through a
// parameter() view is not seen until pack_weights() again (the documented contract).
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/mha_incremental.hpp"
#include "core/cpu_features.hpp"
#include "kernels/isa.hpp"
#include "mha_test_util.hpp"

namespace attn {
namespace {

using detail::Isa;
using detail::isa_name;
using mha_test::random_tensor;
using mha_test::randomise;
using test::all_bit_equal;
using test::bit_equal;

struct Layer {
    std::int64_t E, h, kdim, vdim, B, L;
    DType dtype;
};

MhaConfig config_of(const Layer& s) {
    return MhaConfig{.embed_dim = s.E, .num_heads = s.h, .kdim = s.kdim, .vdim = s.vdim, .batch_first = true, .param_dtype = s.dtype};
}

// The inference entry points a layer has for these inputs, outputs concatenated in one list.
std::vector<Tensor> infer(const MultiHeadAttention& m, const Layer& s, const Tensor& q, const Tensor& k, const Tensor& v) {
    std::vector<Tensor> out;
    MhaForwardOptions o;
    o.need_weights = false;
    out.push_back(m.forward(q, k, v, o).output);
    if (s.kdim == s.E && s.vdim == s.E) {
        out.push_back(m.forward(q, q, q, o).output);  // self-attention: the fused QKV GEMM
        // forward_incremental: 2 tokens per sequence, then 1 (a decode step: the few-row GEMM)
        KVCacheConfig kc;
        kc.batch = s.B;
        kc.kv_heads = s.h;
        kc.head_dim = s.E / s.h;
        kc.capacity = 4;
        KVCache cache(kc);
        std::mt19937 rng(7);
        const Tensor x2 = random_tensor(Shape{s.B, 2, s.E}, rng), x1 = random_tensor(Shape{s.B, 1, s.E}, rng);
        out.push_back(m.forward_incremental(x2, cache));
        out.push_back(m.forward_incremental(x1, cache));
        // forward_packed: the rows of the batch as sequences of lengths L and L − 1
        Tensor cu(DType::i64, Shape{3});
        cu.data_as<std::int64_t>()[0] = 0;
        cu.data_as<std::int64_t>()[1] = s.L;
        cu.data_as<std::int64_t>()[2] = 2 * s.L - 1;
        const TensorView rows = TensorView(q.data(), DType::f32, Shape{2 * s.L - 1, s.E});
        out.push_back(m.forward_packed(rows, rows, rows, cu, cu));
    }
    return out;
}

// Two layers with the same random weights (layers are not copyable).
void randomise_same(MultiHeadAttention& a, MultiHeadAttention& b, unsigned seed) {
    std::mt19937 r1(seed), r2(seed);
    randomise(a, r1);
    randomise(b, r2);
}

bool none_bit_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
        if (bit_equal(a[i], b[i])) return false;
    return true;
}

// Adds `delta` to element i of a parameter, in its storage dtype (through the writable view).
void nudge(const MultiHeadAttention& m, const char* name, std::int64_t i, double delta) {
    const TensorView p = m.parameter(name);
    test::store(p, i, test::load(p, i) + delta);
}

std::vector<const detail::KernelSet*> rows_or_skip() {
    for (Isa isa : {Isa::avx2, Isa::avx512})
        if (detail::kernel_set_for(isa) == nullptr) std::printf("skipped: CPU lacks %s\n", isa_name(isa));
    return detail::runnable_kernel_sets();
}

// E = 96 (one K chunk); E = 1040 (two K chunks on every row, an edge sliver in N = 3E and in
// N = E); cross-attention with separate q/k/v_proj_weight; float16 and bfloat16 weights
// (tests/gemm checks 16-bit B over several K chunks).
const Layer kLayers[] = {{96, 4, 96, 96, 2, 9, DType::f32},   {1040, 8, 1040, 1040, 2, 3, DType::f32},
                         {96, 4, 40, 24, 2, 5, DType::f32},   {96, 4, 96, 96, 3, 7, DType::bf16},
                         {96, 4, 96, 96, 2, 9, DType::f16}};

TEST(MhaPrepacked, BitIdenticalToUnpackedOnEveryRowAndThreadCount) {
    for (const detail::KernelSet* row : rows_or_skip()) {
        const detail::ScopedKernelSet use(*row);
        for (const Layer& s : kLayers) {
            SCOPED_TRACE(std::string(isa_name(row->isa)) + " E=" + std::to_string(s.E) + " kdim=" + std::to_string(s.kdim) + " " +
                         std::string(dtype_name(s.dtype)));
            std::mt19937 rng(11);
            MultiHeadAttention plain(config_of(s)), packed(config_of(s));
            randomise_same(plain, packed, 21);
            const Tensor q = random_tensor(Shape{s.B, s.L, s.E}, rng), k = random_tensor(Shape{s.B, s.L + 2, s.kdim}, rng),
                         v = random_tensor(Shape{s.B, s.L + 2, s.vdim}, rng);
            EXPECT_FALSE(packed.weights_packed());
            packed.pack_weights();
            EXPECT_TRUE(packed.weights_packed());
            const std::vector<Tensor> want = infer(plain, s, q, k, v);
            const int before = omp_get_max_threads();
            for (int threads : {1, 2}) {
                omp_set_num_threads(threads);
                EXPECT_TRUE(all_bit_equal(infer(packed, s, q, k, v), want)) << threads << " threads";
            }
            omp_set_num_threads(before);

            // The panels are what the packed layer reads: a write through a view is not seen
            // (documented) until pack_weights() again; then it is, as in the unpacked layer.
            // out_proj.weight is read packed by every entry point (the incremental steps too).
            const bool fused = s.kdim == s.E;
            for (const MultiHeadAttention* m : {&plain, &packed}) nudge(*m, "out_proj.weight", 5, -0.5);
            std::vector<Tensor> changed = infer(plain, s, q, k, v);
            EXPECT_TRUE(none_bit_equal(changed, want)) << "the nudge changes every output";
            std::vector<Tensor> stale = infer(packed, s, q, k, v);
            for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(bit_equal(stale[i], want[i])) << "output " << i;
            // The input weight is packed where the GEMM takes the whole matrix: the fused QKV
            // GEMM of self-attention (output 1), the separate K projection (output 0).
            const std::size_t i_in = fused ? 1 : 0;
            const Tensor before_in = std::move(infer(packed, s, q, k, v)[i_in]);
            for (const MultiHeadAttention* m : {&plain, &packed}) nudge(*m, fused ? "in_proj_weight" : "k_proj_weight", 3 + s.E, 0.5);
            changed = infer(plain, s, q, k, v);
            EXPECT_FALSE(bit_equal(changed[i_in], before_in));
            EXPECT_TRUE(bit_equal(infer(packed, s, q, k, v)[i_in], before_in)) << "stale panels until pack_weights()";
            packed.pack_weights();
            EXPECT_TRUE(all_bit_equal(infer(packed, s, q, k, v), changed));
            packed.unpack_weights();
            EXPECT_FALSE(packed.weights_packed());
            EXPECT_TRUE(all_bit_equal(infer(packed, s, q, k, v), changed));
        }
    }
}

TEST(MhaPrepacked, LoadStateDictAndSetParamDtypeRepack) {
    const Layer s{96, 4, 96, 96, 2, 9, DType::f32};
    std::mt19937 rng(12);
    MultiHeadAttention plain(config_of(s)), packed(config_of(s));
    randomise_same(plain, packed, 120);
    packed.pack_weights();
    const Tensor x = random_tensor(Shape{s.B, s.L, s.E}, rng);
    const std::vector<Tensor> before = infer(packed, s, x, x, x);

    std::mt19937 rng2(13);  // the same new weights into both layers
    randomise(plain, rng2);
    rng2.seed(13);
    randomise(packed, rng2);
    EXPECT_TRUE(packed.weights_packed());
    const std::vector<Tensor> after = infer(plain, s, x, x, x);
    EXPECT_TRUE(none_bit_equal(after, before));
    EXPECT_TRUE(all_bit_equal(infer(packed, s, x, x, x), after));

    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
        plain.set_param_dtype(dt);
        packed.set_param_dtype(dt);
        EXPECT_TRUE(packed.weights_packed());
        EXPECT_TRUE(all_bit_equal(infer(packed, s, x, x, x), infer(plain, s, x, x, x))) << dtype_name(dt);
    }
    // bf16 → f16 → f32 rounded the weights: the outputs moved, so the repacking was needed.
    EXPECT_TRUE(none_bit_equal(infer(packed, s, x, x, x), after));
}

TEST(MhaPrepacked, TrainingReadsTheParameters) {
    const Layer s{96, 4, 96, 96, 2, 9, DType::f32};
    std::mt19937 rng(14);
    MultiHeadAttention plain(config_of(s)), packed(config_of(s));
    randomise_same(plain, packed, 140);
    packed.pack_weights();
    const Tensor x = random_tensor(Shape{s.B, s.L, s.E}, rng);
    // A training step's update through the views (no pack_weights() after it).
    for (const MultiHeadAttention* m : {&plain, &packed}) {
        nudge(*m, "in_proj_weight", 7, 0.25);
        nudge(*m, "out_proj.weight", 2, 0.25);
    }
    MhaForwardState a, b;
    const Tensor want = plain.forward_train(x, x, x, {}, {}, a);
    EXPECT_TRUE(bit_equal(packed.forward_train(x, x, x, {}, {}, b), want));
    const Tensor g = random_tensor(want.shape(), rng);
    const MhaGradients ga = plain.backward(a, g), gb = packed.backward(b, g);
    ASSERT_EQ(ga.params.size(), gb.params.size());
    for (std::size_t i = 0; i < ga.params.size(); ++i) EXPECT_TRUE(bit_equal(ga.params[i].second, gb.params[i].second)) << ga.params[i].first;
    EXPECT_TRUE(bit_equal(ga.query, gb.query));
}

TEST(MhaPrepacked, PanelsOfAnotherRowAreNotUsed) {
    const std::vector<const detail::KernelSet*> rows = rows_or_skip();
    if (rows.size() < 2) GTEST_SKIP() << "one kernel-table row on this CPU";
    const Layer s{96, 4, 96, 96, 2, 9, DType::f32};
    std::mt19937 rng(15);
    MultiHeadAttention plain(config_of(s)), packed(config_of(s));
    randomise_same(plain, packed, 150);
    const Tensor x = random_tensor(Shape{s.B, s.L, s.E}, rng);
    {
        const detail::ScopedKernelSet use(*rows.front());
        packed.pack_weights();
    }
    for (const detail::KernelSet* row : rows) {
        const detail::ScopedKernelSet use(*row);
        EXPECT_TRUE(all_bit_equal(infer(packed, s, x, x, x), infer(plain, s, x, x, x))) << isa_name(row->isa);
    }
}

}  // namespace
}  // namespace attn
