// A caller's flush-to-zero (core/float_env.hpp): torch.set_flush_denormal(True) sets MXCSR's FTZ
// and DAZ on the thread that asks, not on OpenMP's pool threads started before. attn computes with
// IEEE subnormals whatever either had: the bits of the default environment, on 1 and 2 threads,
// and the caller's bits given back. The inputs hold subnormals: bfloat16 V and dO of ~1e-39 (a
// bfloat16 subnormal is a float32 one), so DAZ read them as 0 and FTZ flushed the outputs; and a
// float32 KV cache widens bfloat16 subnormals (read through double, which DAZ made 0).
#include <gtest/gtest.h>

#if defined(__SSE2__)
#include <omp.h>
#include <xmmintrin.h>

#include <random>

#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"

namespace attn {
namespace {

constexpr unsigned kFlushBits = 0x8040u;  // FTZ (bit 15), DAZ (bit 6)

void set_flush_here(bool on) { _mm_setcsr(on ? (_mm_getcsr() | kFlushBits) : (_mm_getcsr() & ~kFlushBits)); }

// On every thread of OpenMP's pool (2 threads, as the calls below use), the calling one included.
void set_flush_in_pool(bool on) {
#pragma omp parallel num_threads(2)
    set_flush_here(on);
}

struct Inputs {
    Tensor q, k, v, dO;
};

Inputs subnormal_inputs() {
    std::mt19937_64 rng(5);
    const std::int64_t B = 1, H = 4, Lq = 40, Lk = 150, D = 32;
    return {test::to_storage(test::randn(DType::f32, Shape{B, H, Lq, D}, rng), DType::bf16),
            test::to_storage(test::randn(DType::f32, Shape{B, H, Lk, D}, rng), DType::bf16),
            test::to_storage(test::randn(DType::f32, Shape{B, H, Lk, D}, rng, 1e-39), DType::bf16),
            test::to_storage(test::randn(DType::f32, Shape{B, H, Lq, D}, rng, 1e-39), DType::bf16)};
}

struct Results {
    Tensor out, lse, decode_out, dq, dk, dv;
};

// Forward (flash, and decode on the first 4 queries), backward; float32 outputs so that nothing
// rounds the subnormals away.
Results run(const Inputs& in, int threads) {
    const ScopedNumThreads scope(threads);
    const TensorView q = in.q.view();
    const std::int64_t B = q.dim(0), H = q.dim(1), Lq = q.dim(2), D = q.dim(3), Lk = in.k.view().dim(2);
    Results r{Tensor(DType::f32, Shape{B, H, Lq, D}), Tensor(DType::f32, Shape{B, H, Lq}),
              Tensor(DType::f32, Shape{B, H, 4, D}), Tensor(DType::f32, Shape{B, H, Lq, D}),
              Tensor(DType::f32, Shape{B, H, Lk, D}), Tensor(DType::f32, Shape{B, H, Lk, D})};
    SdpaOptions o;
    o.impl = Impl::flash;
    const TensorView lse = r.lse;
    sdpa(in.q, in.k, in.v, o, r.out, &lse);
    o.impl = Impl::decode;
    sdpa(q.slice(2, 0, 4), in.k, in.v, o, r.decode_out);
    o.impl = Impl::flash;
    sdpa_backward(in.q, in.k, in.v, r.out, r.lse, in.dO, o, r.dq, r.dk, r.dv);
    return r;
}

void expect_same(const Results& got, const Results& want, const char* what) {
    EXPECT_TRUE(test::bit_equal(got.out, want.out)) << what << ": out";
    EXPECT_TRUE(test::bit_equal(got.lse, want.lse)) << what << ": lse";
    EXPECT_TRUE(test::bit_equal(got.decode_out, want.decode_out)) << what << ": decode out";
    EXPECT_TRUE(test::bit_equal(got.dq, want.dq)) << what << ": dq";
    EXPECT_TRUE(test::bit_equal(got.dk, want.dk)) << what << ": dk";
    EXPECT_TRUE(test::bit_equal(got.dv, want.dv)) << what << ": dv";
}

TEST(FloatEnv, CallersFlushToZeroChangesNothing) {
    const Inputs in = subnormal_inputs();
    const Results want = run(in, 1);  // the default environment (and the pool started without flushing)
    ASSERT_GT(test::max_abs(want.out), 0.0);
    ASSERT_LT(test::max_abs(want.out), 1.2e-38) << "the outputs should be float32 subnormals";
    expect_same(run(in, 2), want, "2 threads");

    set_flush_here(true);  // torch.set_flush_denormal(True): the calling thread only
    const Results caller1 = run(in, 1), caller2 = run(in, 2);
    EXPECT_EQ(_mm_getcsr() & kFlushBits, kFlushBits) << "the caller's FTZ/DAZ are given back";
    set_flush_here(false);
    expect_same(caller1, want, "the caller flushing, 1 thread");
    expect_same(caller2, want, "the caller flushing, 2 threads");

    set_flush_in_pool(true);  // a pool started by a flushing thread
    const Results pool2 = run(in, 2);
    set_flush_in_pool(false);
    expect_same(pool2, want, "every thread flushing, 2 threads");
}

TEST(FloatEnv, CacheAppendKeepsSubnormalsUnderCallersFlush) {
    std::mt19937_64 rng(6);
    const Tensor k = test::to_storage(test::randn(DType::f32, Shape{1, 2, 5, 16}, rng, 1e-39), DType::bf16);
    KVCacheConfig config;
    config.kv_heads = 2;
    config.head_dim = 16;
    config.capacity = 8;
    config.storage = DType::f32;
    KVCache want(config), got(config);
    want.append(k, k);
    set_flush_here(true);
    got.append(k, k);
    set_flush_here(false);
    const TensorView wk = want.keys(), gk = got.keys();
    std::int64_t nonzero = 0;
    for (std::int64_t i = 0; i < 2 * 5 * 16; ++i) {
        const std::int64_t off = wk.offset(0, i / 80, (i / 16) % 5, i % 16);
        EXPECT_EQ(test::load(gk, off), test::load(wk, off)) << "element " << i;
        nonzero += test::load(wk, off) != 0.0;
    }
    EXPECT_GT(nonzero, 0) << "the keys should be subnormals";
}

// PagedKVCache::append widens rows as KVCache's does (rows.hpp, through double): the same guard.
TEST(FloatEnv, PagedCacheAppendKeepsSubnormalsUnderCallersFlush) {
    std::mt19937_64 rng(7);
    const Tensor k = test::to_storage(test::randn(DType::f32, Shape{2, 5, 16}, rng, 1e-39), DType::bf16);
    PagedKVCacheConfig config;
    config.kv_heads = 2;
    config.head_dim = 16;
    config.page_size = 8;
    config.num_pages = 1;
    config.storage = DType::f32;
    PagedKVCache want(config), got(config);
    want.append(want.add_sequence(), k, k);
    set_flush_here(true);
    got.append(got.add_sequence(), k, k);
    set_flush_here(false);
    const TensorView wk = want.key_pages(), gk = got.key_pages();  // (Hkv, 1 page, 8 rows, 16)
    std::int64_t nonzero = 0;
    for (std::int64_t i = 0; i < 2 * 5 * 16; ++i) {
        const std::int64_t off = wk.offset(i / 80, 0, (i / 16) % 5, i % 16);
        EXPECT_EQ(test::load(gk, off), test::load(wk, off)) << "element " << i;
        nonzero += test::load(wk, off) != 0.0;
    }
    EXPECT_GT(nonzero, 0) << "the keys should be subnormals";
}

// attn::to_dtype converts through double (load_as_double, store): under the caller's DAZ a
// bfloat16 subnormal (a float32 one) read as 0, and under FTZ a float32 subnormal rounded to
// bfloat16 became 0. Python's KVCache.keys()/values() and MultiHeadAttention.load_state_dict
// convert with it outside any computing call.
TEST(FloatEnv, ToDtypeKeepsSubnormalsUnderCallersFlush) {
    std::mt19937_64 rng(8);
    const Tensor f32 = test::randn(DType::f32, Shape{3, 40}, rng, 1e-39);
    const Tensor bf16 = test::to_storage(f32, DType::bf16);
    const Tensor widened = to_dtype(bf16, DType::f32), narrowed = to_dtype(f32, DType::bf16);
    ASSERT_GT(test::max_abs(widened), 0.0);
    set_flush_here(true);
    const Tensor widened_flushing = to_dtype(bf16, DType::f32), narrowed_flushing = to_dtype(f32, DType::bf16);
    EXPECT_EQ(_mm_getcsr() & kFlushBits, kFlushBits) << "the caller's FTZ/DAZ are given back";
    set_flush_here(false);
    EXPECT_TRUE(test::bit_equal(widened_flushing, widened)) << "bfloat16 -> float32";
    EXPECT_TRUE(test::bit_equal(narrowed_flushing, narrowed)) << "float32 -> bfloat16";
}

}  // namespace
}  // namespace attn
#else
TEST(FloatEnv, CallersFlushToZeroChangesNothing) { GTEST_SKIP() << "skipped: not an SSE target"; }
#endif
