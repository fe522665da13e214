// KVCache bookkeeping: append (whole batch, one sequence, strided sources, every storage
// type), overflow (error, nothing written) and growth, truncate, reset, and the messages.
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "decode_util.hpp"

// Under ASan, an allocation above its limit aborts unless it may return null; the size tests
// below exercise exactly that path (a harmless unused symbol in a normal build).
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace attn::test {
namespace {

KVCacheConfig config(DType dt, std::int64_t cap, bool grow = false) {
    KVCacheConfig c;
    c.batch = 2;
    c.kv_heads = 3;
    c.head_dim = 5;
    c.value_dim = 4;
    c.capacity = cap;
    c.storage = dt;
    c.grow = grow;
    return c;
}

// The stored element (b, h, pos, d) of keys or values, as float.
float stored(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t pos, std::int64_t d) {
    return static_cast<float>(t.load_as_double(t.offset(b, h, pos, d)));
}

// What storage type dt makes of x (the scalar conversions are the specification).
float rounded(float x, DType dt) {
    if (dt == DType::f16) return f16_to_float(float_to_f16(x));
    if (dt == DType::bf16) return bf16_to_float(float_to_bf16(x));
    return x;
}

// Checks positions [from, from+T) of sequence b hold src (Hkv, T, D) rounded to the storage.
void expect_rows(const KVCache& c, const TensorView& stored_view, std::int64_t b, std::int64_t from,
                 const Tensor& src, std::int64_t src_b) {
    const std::int64_t T = src.shape()[2], D = src.shape()[3];
    for (std::int64_t h = 0; h < c.kv_heads(); ++h)
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t d = 0; d < D; ++d) {
                const float want = rounded(src.data_as<float>()[((src_b * c.kv_heads() + h) * T + t) * D + d], c.storage());
                ASSERT_EQ(stored(stored_view, b, h, from + t, d), want) << "b=" << b << " h=" << h << " pos=" << from + t;
            }
}

TEST(KVCache, AppendBatchAndSequenceEveryStorage) {
    std::mt19937 rng(11);
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
        KVCache c(config(dt, 16));
        EXPECT_EQ(c.capacity(), 16);
        EXPECT_EQ(c.max_length(), 0);
        const Tensor k1 = random_f32(Shape{2, 3, 4, 5}, rng), v1 = random_f32(Shape{2, 3, 4, 4}, rng);
        c.append(k1, v1);
        EXPECT_EQ(c.length(0), 4);
        EXPECT_EQ(c.length(1), 4);
        // One sequence only: sequence 1 gets 3 more tokens, from a (B, T, H, D) buffer seen
        // through a transpose — strided source rows.
        const Tensor kt = random_f32(Shape{1, 3, 3, 5}, rng), vt = random_f32(Shape{1, 3, 3, 4}, rng);
        const Tensor kbthd = random_f32(Shape{3, 3, 5}, rng);  // (T, H, D)
        const TensorView k_seq = kbthd.view().transpose(0, 1);  // (H, T, D), strided
        c.append(1, k_seq, TensorView(vt.data(), DType::f32, Shape{3, 3, 4}));
        EXPECT_EQ(c.length(0), 4);
        EXPECT_EQ(c.length(1), 7);
        EXPECT_EQ(c.max_length(), 7);
        expect_rows(c, c.keys(), 0, 0, k1, 0);
        expect_rows(c, c.keys(), 1, 0, k1, 1);
        expect_rows(c, c.values(), 1, 0, v1, 1);
        expect_rows(c, c.values(), 1, 4, vt, 0);
        for (std::int64_t h = 0; h < 3; ++h)
            for (std::int64_t t = 0; t < 3; ++t)
                for (std::int64_t d = 0; d < 5; ++d)
                    ASSERT_EQ(stored(c.keys(), 1, h, 4 + t, d), rounded(kbthd.data_as<float>()[(t * 3 + h) * 5 + d], dt));
        EXPECT_EQ(c.keys().shape(), (Shape{2, 3, 16, 5}));
        EXPECT_EQ(c.values().dtype(), dt);
    }
}

// float64 K/V are rounded once to a 16-bit storage, as double_to_f16/bf16 do: through float32
// they were rounded twice (1 + 2^-11 + 2^-40 became 1 in float16). Both caches share the rows code.
TEST(KVCache, Float64RowsAreRoundedOnceToSixteenBits) {
    for (DType dt : {DType::f16, DType::bf16}) {
        KVCache c(config(dt, 4));
        const int bits = dt == DType::f16 ? 11 : 8;
        Tensor k(DType::f64, Shape{2, 3, 1, 5}), v(DType::f64, Shape{2, 3, 1, 4});
        for (std::int64_t i = 0; i < k.numel(); ++i)
            k.data_as<double>()[i] = (1 + std::ldexp(1.0, -bits) + std::ldexp(1.0, -40)) * (i % 2 ? -1 : 1) * (1 + i);
        for (std::int64_t i = 0; i < v.numel(); ++i) v.data_as<double>()[i] = 0.25;
        c.append(k, v);
        for (std::int64_t i = 0; i < k.numel(); ++i) {
            const double x = k.data_as<double>()[i];
            const std::uint16_t want = dt == DType::f16 ? double_to_f16(x) : double_to_bf16(x);
            const std::int64_t b = i / 15, h = (i / 5) % 3, d = i % 5;
            const std::uint16_t got = c.keys().data_as<const std::uint16_t>()[c.keys().offset(b, h, 0, d)];
            ASSERT_EQ(got, want) << dtype_name(dt) << " x=" << x;
        }
    }
}

TEST(KVCache, OverflowThrowsAndWritesNothing) {
    std::mt19937 rng(12);
    KVCache c(config(DType::f16, 6));
    const Tensor k1 = random_f32(Shape{2, 3, 4, 5}, rng), v1 = random_f32(Shape{2, 3, 4, 4}, rng);
    c.append(k1, v1);
    c.append(0, TensorView(random_f32(Shape{3, 2, 5}, rng).data(), DType::f32, Shape{3, 2, 5}),
             TensorView(random_f32(Shape{3, 2, 4}, rng).data(), DType::f32, Shape{3, 2, 4}));
    // Sequence 0 is full (6/6); sequence 1 has room for 2. A batch append of 1 must fail
    // before touching sequence 1 either.
    std::vector<char> before(static_cast<std::size_t>(2 * 3 * 6 * 5 * 2));
    std::memcpy(before.data(), c.keys().data(), before.size());
    const Tensor k2 = random_f32(Shape{2, 3, 1, 5}, rng), v2 = random_f32(Shape{2, 3, 1, 4}, rng);
    const std::string err = error_of([&] { c.append(k2, v2); });
    EXPECT_EQ(err,
              "KVCache: append: sequence 0 holds 6 of 6 positions; 1 more need 7 (nothing was written; enable "
              "growth, reserve() more, or truncate first)");
    EXPECT_EQ(c.length(0), 6);
    EXPECT_EQ(c.length(1), 4);
    EXPECT_EQ(std::memcmp(before.data(), c.keys().data(), before.size()), 0);
    // Sequence 1 alone still fits.
    const Tensor k3 = random_f32(Shape{3, 2, 5}, rng);
    c.append(1, k3, TensorView(random_f32(Shape{3, 2, 4}, rng).data(), DType::f32, Shape{3, 2, 4}));
    EXPECT_EQ(c.length(1), 6);
    EXPECT_NE(error_of([&] { c.append(1, k3, TensorView(k3.data(), DType::f32, Shape{3, 2, 4})); }).find("sequence 1 holds 6 of 6"),
              std::string::npos);
}

TEST(KVCache, GrowthKeepsContentsAndRespectsLimit) {
    std::mt19937 rng(13);
    KVCacheConfig cfg = config(DType::bf16, 3, true);
    cfg.max_capacity = 10;
    KVCache c(cfg);
    const Tensor k1 = random_f32(Shape{2, 3, 3, 5}, rng), v1 = random_f32(Shape{2, 3, 3, 4}, rng);
    c.append(k1, v1);
    const Tensor k2 = random_f32(Shape{2, 3, 2, 5}, rng), v2 = random_f32(Shape{2, 3, 2, 4}, rng);
    c.append(k2, v2);  // 5 > 3: grows to max(5, 2·3) = 6
    EXPECT_EQ(c.capacity(), 6);
    expect_rows(c, c.keys(), 1, 0, k1, 1);
    expect_rows(c, c.values(), 0, 0, v1, 0);
    expect_rows(c, c.keys(), 0, 3, k2, 0);
    const Tensor k3 = random_f32(Shape{2, 3, 4, 5}, rng), v3 = random_f32(Shape{2, 3, 4, 4}, rng);
    c.append(k3, v3);  // 9: min(max(9, 12), 10) = 10
    EXPECT_EQ(c.capacity(), 10);
    expect_rows(c, c.keys(), 1, 5, k3, 1);
    expect_rows(c, c.keys(), 1, 0, k1, 1);
    const std::string err = error_of([&] { c.append(k2, v2); });
    EXPECT_EQ(err, "KVCache: append: sequence 0 would need 11 positions but max_capacity is 10 (nothing was written)");
    EXPECT_EQ(c.length(0), 9);
    c.reserve(10);
    EXPECT_NE(error_of([&] { c.reserve(11); }).find("exceeds max_capacity 10"), std::string::npos);
}

// An append may read its tokens from the cache itself (a prompt prefix copied from one
// sequence to another, or repeated): when it grows, the old storage it reads must outlive
// the copy (it was freed first: a use after free that ASan reports, kernels_asan runs this).
TEST(KVCache, AppendReadsViewsOfItsOwnStorageWhileGrowing) {
    std::mt19937 rng(29);
    for (DType dt : {DType::f32, DType::f16}) {
        KVCache c(config(dt, 4, true));
        const Tensor k1 = random_f32(Shape{2, 3, 4, 5}, rng), v1 = random_f32(Shape{2, 3, 4, 4}, rng);
        c.append(k1, v1);  // full: both sequences hold 4 of 4 positions
        const TensorView K = c.keys(), V = c.values();
        // Sequence 0's 4 tokens as (Hkv, T, D) views of the storage, appended to sequence 1.
        const TensorView k0(K.data(), dt, Shape{3, 4, 5}, Strides{K.stride(1), K.stride(2), K.stride(3)});
        const TensorView v0(V.data(), dt, Shape{3, 4, 4}, Strides{V.stride(1), V.stride(2), V.stride(3)});
        c.append(1, k0, v0);  // 8 > 4: grows while reading k0/v0 from the old buffers
        EXPECT_EQ(c.capacity(), 8);
        ASSERT_EQ(c.length(1), 8);
        expect_rows(c, c.keys(), 1, 4, k1, 0);  // sequence 0's keys, already rounded: unchanged
        expect_rows(c, c.values(), 1, 4, v1, 0);
        expect_rows(c, c.keys(), 1, 0, k1, 1);
        // The whole batch from views of itself: (B, Hkv, T, D) = positions 0..3 of every sequence.
        const TensorView K2 = c.keys(), V2 = c.values();
        const TensorView kb(K2.data(), dt, Shape{2, 3, 4, 5}, K2.strides()), vb(V2.data(), dt, Shape{2, 3, 4, 4}, V2.strides());
        c.append(kb, vb);  // sequence 1: 12 > 8, grows again
        expect_rows(c, c.keys(), 0, 4, k1, 0);
        expect_rows(c, c.values(), 1, 8, v1, 1);
    }
}

// A token viewing the free positions overlaps the row it is appended to (here: half of
// position 0, half of the free position 1 it goes to). It reads defined memory: the row is
// copied as it was before the call (memmove; memcpy's overlap was undefined behaviour that
// ASan reported as memcpy-param-overlap: kernels_asan runs this).
TEST(KVCache, AppendFromAViewOverlappingItsOwnRow) {
    std::mt19937 rng(31);
    KVCache c(config(DType::f32, 4));
    const Tensor k1 = random_f32(Shape{2, 3, 2, 5}, rng), v1 = random_f32(Shape{2, 3, 2, 4}, rng);
    c.append(k1, v1);
    c.truncate(0, 1);  // position 1 of sequence 0 is free again (and still holds k1's row 1)
    float* K = c.keys().data_as<float>();
    float* V = c.values().data_as<float>();
    // Head 0's row straddling positions 0 and 1; the other heads' rows at their position 1.
    const TensorView k(K + 3, DType::f32, Shape{3, 1, 5}, Strides{c.keys().stride(1), 5, 1});
    const TensorView v(V + 2, DType::f32, Shape{3, 1, 4}, Strides{c.values().stride(1), 4, 1});
    std::vector<float> k_before(15), v_before(12);
    for (int h = 0; h < 3; ++h) {
        for (int d = 0; d < 5; ++d) k_before[static_cast<std::size_t>(h * 5 + d)] = k.data_as<float>()[k.offset(h, 0, d)];
        for (int d = 0; d < 4; ++d) v_before[static_cast<std::size_t>(h * 4 + d)] = v.data_as<float>()[v.offset(h, 0, d)];
    }
    c.append(0, k, v);
    ASSERT_EQ(c.length(0), 2);
    for (int h = 0; h < 3; ++h) {
        for (int d = 0; d < 5; ++d)
            EXPECT_EQ(c.keys().data_as<float>()[c.keys().offset(0, h, 1, d)], k_before[static_cast<std::size_t>(h * 5 + d)]);
        for (int d = 0; d < 4; ++d)
            EXPECT_EQ(c.values().data_as<float>()[c.values().offset(0, h, 1, d)], v_before[static_cast<std::size_t>(h * 4 + d)]);
    }
}

// An idle slot (an empty sequence) of a batch under causal masking takes the alignment rule —
// its rows see no key: out 0, lse −inf — while the other sequences decode as alone. It was
// refused as "append the new tokens first", which stopped the whole batch's step (a helper
// using the Python API found it). Both alignments, every ISA row through `auto`.
TEST(KVCache, CausalDecodeWithAnIdleSlot) {
    std::mt19937 rng(37);
    KVCache c(config(DType::f32, 8));
    c.append(0, random_f32(Shape{3, 5, 5}, rng), random_f32(Shape{3, 5, 4}, rng));  // sequence 1 stays empty
    const Tensor q = random_f32(Shape{2, 6, 2, 5}, rng);
    for (Causal causal : {Causal::bottom_right, Causal::top_left}) {
        SdpaOptions o;
        o.causal = causal;
        Tensor out(DType::f32, Shape{2, 6, 2, 4}), lse(DType::f32, Shape{2, 6, 2});
        poison(out);
        poison(lse);
        const TensorView lse_view = lse;
        decode_attention(q, c, o, out, &lse_view);
        // Sequence 0 alone, against the reference on its 5 rows.
        Tensor out0(DType::f32, Shape{1, 6, 2, 4}), lse0(DType::f32, Shape{1, 6, 2});
        const TensorView lse0_view = lse0;
        o.impl = Impl::reference;
        sdpa(q.view().slice(0, 0, 1), c.keys().slice(0, 0, 1).slice(2, 0, 5), c.values().slice(0, 0, 1).slice(2, 0, 5),
             o, out0, &lse0_view);
        for (std::int64_t h = 0; h < 6; ++h)
            for (std::int64_t i = 0; i < 2; ++i) {
                EXPECT_NEAR(lse.data_as<float>()[lse.view().offset(0, h, i)], lse0.data_as<float>()[lse0.view().offset(0, h, i)], 1e-5);
                EXPECT_EQ(lse.data_as<float>()[lse.view().offset(1, h, i)], -std::numeric_limits<float>::infinity());
                for (std::int64_t d = 0; d < 4; ++d) {
                    EXPECT_NEAR(out.data_as<float>()[out.view().offset(0, h, i, d)],
                                out0.data_as<float>()[out0.view().offset(0, h, i, d)], 1e-5);
                    EXPECT_EQ(out.data_as<float>()[out.view().offset(1, h, i, d)], 0.0f);
                }
            }
    }
    // A sequence with some positions but fewer than the new queries is still refused.
    c.append(1, random_f32(Shape{3, 1, 5}, rng), random_f32(Shape{3, 1, 4}, rng));
    Tensor out(DType::f32, Shape{2, 6, 2, 4});
    EXPECT_EQ(error_of([&] { decode_attention(q, c, causal_bottom_right(), out); }),
              "decode_attention: cache: sequence 1 holds 1 positions but there are 2 new queries; append the new "
              "tokens' K and V to the cache before decode_attention");
}

TEST(KVCache, TruncateAndResetRollBack) {
    std::mt19937 rng(14);
    KVCache c(config(DType::f32, 8));
    const Tensor k1 = random_f32(Shape{2, 3, 5, 5}, rng), v1 = random_f32(Shape{2, 3, 5, 4}, rng);
    c.append(k1, v1);
    c.truncate(1, 2);  // reject 3 speculative tokens of sequence 1
    EXPECT_EQ(c.length(0), 5);
    EXPECT_EQ(c.length(1), 2);
    const Tensor k2 = random_f32(Shape{2, 3, 3, 5}, rng), v2 = random_f32(Shape{2, 3, 3, 4}, rng);
    c.append(k2, v2);  // each sequence continues at its own end
    EXPECT_EQ(c.length(0), 8);
    EXPECT_EQ(c.length(1), 5);
    expect_rows(c, c.keys(), 1, 2, k2, 1);
    expect_rows(c, c.keys(), 0, 5, k2, 0);
    for (std::int64_t h = 0; h < 3; ++h)  // positions 0 and 1 of sequence 1 are kept
        for (std::int64_t t = 0; t < 2; ++t)
            for (std::int64_t d = 0; d < 5; ++d)
                ASSERT_EQ(stored(c.keys(), 1, h, t, d), k1.data_as<float>()[((1 * 3 + h) * 5 + t) * 5 + d]);
    EXPECT_EQ(error_of([&] { c.truncate(1, 6); }), "KVCache: truncate: new length of sequence 1 must be in [0, 5] but got 6");
    EXPECT_EQ(error_of([&] { c.truncate(2, 0); }), "KVCache: truncate: sequence index must be in [0, 2) but got 2");
    EXPECT_EQ(error_of([&] { c.reset(-1); }), "KVCache: reset: sequence index must be in [0, 2) but got -1");
    c.truncate_all(4);
    EXPECT_EQ(c.length(0), 4);
    EXPECT_EQ(c.length(1), 4);
    c.reset(0);
    EXPECT_EQ(c.length(0), 0);
    EXPECT_EQ(c.length(1), 4);
    c.reset();
    EXPECT_EQ(c.max_length(), 0);
    EXPECT_EQ(c.capacity(), 8);
}

TEST(KVCache, ArgumentErrorsNameTheArgument) {
    KVCacheConfig bad = config(DType::f64, 4);
    EXPECT_EQ(error_of([&] { KVCache c(bad); }), "KVCache: storage must be float32, float16 or bfloat16 but got float64");
    bad = config(DType::f32, 0);
    EXPECT_EQ(error_of([&] { KVCache c(bad); }), "KVCache: capacity must be >= 1 but got 0");
    bad = config(DType::f32, 4);
    bad.max_capacity = 2;
    EXPECT_NE(error_of([&] { KVCache c(bad); }).find("max_capacity must be 0 (no limit) or >= capacity 4"), std::string::npos);

    KVCache c(config(DType::f32, 4));
    Tensor k(DType::f32, Shape{2, 3, 1, 6}, true), v(DType::f32, Shape{2, 3, 1, 4}, true);
    EXPECT_EQ(error_of([&] { c.append(k, v); }),
              "KVCache: append: k_new must have shape (B, Hkv, T, Dk) = (2, 3, 1, 5) but got (2, 3, 1, 6)");
    Tensor k5(DType::f32, Shape{2, 3, 2, 5}, true);
    EXPECT_EQ(error_of([&] { c.append(k5, v); }),
              "KVCache: append: v_new must have shape (B, Hkv, T, Dv) = (2, 3, 2, 4) but got (2, 3, 1, 4)");
    Tensor ki(DType::i32, Shape{2, 3, 1, 5}, true);
    EXPECT_EQ(error_of([&] { c.append(ki, v); }), "KVCache: append: k_new: dtype must be float32, float64, float16 or bfloat16 but got int32");
    // A tensor of the other overload's rank: T is unknown (it said "= (2, 3, 0, 5)", as if T had to be 0).
    Tensor k3(DType::f32, Shape{3, 1, 5}, true);
    EXPECT_EQ(error_of([&] { c.append(k3, k3); }),
              "KVCache: append: k_new must have rank 4, (B, Hkv, T, Dk) = (2, 3, T, 5) but got (3, 1, 5) "
              "(append(b, k_new, v_new) takes one sequence's (Hkv, T, D))");
    EXPECT_EQ(error_of([&] { c.append(0, k, v); }),
              "KVCache: append: k_new must have rank 3, (Hkv, T, Dk) = (3, T, 5) but got (2, 3, 1, 6) "
              "(append(k_new, v_new) takes every sequence's (B, Hkv, T, D))");
    EXPECT_EQ(c.max_length(), 0);

    // decode_attention's checks.
    std::mt19937 rng(15);
    c.append(random_f32(Shape{2, 3, 2, 5}, rng), random_f32(Shape{2, 3, 2, 4}, rng));
    Tensor q(DType::f32, Shape{2, 6, 3, 5}, true), out(DType::f32, Shape{2, 6, 3, 4});
    EXPECT_EQ(error_of([&] { decode_attention(q, c, causal_bottom_right(), out); }),
              "decode_attention: cache: sequence 0 holds 2 positions but there are 3 new queries; append the new "
              "tokens' K and V to the cache before decode_attention");
    Tensor q4(DType::f32, Shape{2, 4, 1, 5}, true), out4(DType::f32, Shape{2, 4, 1, 4});
    EXPECT_EQ(error_of([&] { decode_attention(q4, c, causal_bottom_right(), out4); }),
              "decode_attention: Q: heads 4 must be a multiple of the cache's kv_heads 3 (grouped-query attention)");
    Tensor q0(DType::f32, Shape{2, 0, 1, 5}, true), out0(DType::f32, Shape{2, 0, 1, 4});
    EXPECT_EQ(error_of([&] { decode_attention(q0, c, causal_bottom_right(), out0); }),
              "decode_attention: Q: heads must be >= 1 but got 0");  // was "heads 0 must be a multiple of"
    Tensor q7(DType::f32, Shape{2, 6, 1, 7}, true);
    EXPECT_EQ(error_of([&] { decode_attention(q7, c, causal_bottom_right(), out4); }),
              "decode_attention: Q: head dim 7 does not match the cache's head_dim 5");
    Tensor q1(DType::f32, Shape{2, 6, 1, 5}, true), bad_out(DType::f32, Shape{2, 6, 1, 5});
    EXPECT_EQ(error_of([&] { decode_attention(q1, c, causal_bottom_right(), bad_out); }),
              "decode_attention: out: expected shape (B, Hq, Lq, Dv) = (2, 6, 1, 4) but got (2, 6, 1, 5)");
    // An output inside the cache would overwrite what the kernel still reads.
    const TensorView into_values(c.values().data(), DType::f32, Shape{2, 6, 1, 4});
    EXPECT_EQ(error_of([&] { decode_attention(q1, c, causal_bottom_right(), into_values); }),
              "decode_attention: out: must not share memory with V (the kernel writes out while it still reads V)");
}

// Appending T = 0 tokens is valid (it appends nothing), so an empty k_new/v_new is accepted
// whatever its data pointer: an empty tensor's may be null (torch's is). It said "k_new data
// pointer is null". A null pointer with elements stays an error.
TEST(KVCache, EmptyAppendWithNullDataChangesNothing) {
    std::mt19937 rng(3);
    KVCache c(config(DType::f32, 4));
    c.append(random_f32(Shape{2, 3, 2, 5}, rng), random_f32(Shape{2, 3, 2, 4}, rng));
    const Tensor keys_before = to_dtype(c.keys(), DType::f32), values_before = to_dtype(c.values(), DType::f32);
    c.append(TensorView(nullptr, DType::f32, Shape{2, 3, 0, 5}), TensorView(nullptr, DType::f32, Shape{2, 3, 0, 4}));
    c.append(1, TensorView(nullptr, DType::f32, Shape{3, 0, 5}), TensorView(nullptr, DType::f32, Shape{3, 0, 4}));
    EXPECT_EQ(c.lengths(), (std::vector<std::int64_t>{2, 2}));
    EXPECT_EQ(std::memcmp(to_dtype(c.keys(), DType::f32).data(), keys_before.data(), keys_before.nbytes()), 0);
    EXPECT_EQ(std::memcmp(to_dtype(c.values(), DType::f32).data(), values_before.data(), values_before.nbytes()), 0);
    EXPECT_EQ(error_of([&] { c.append(0, TensorView(nullptr, DType::f32, Shape{3, 1, 5}), random_f32(Shape{3, 1, 4}, rng)); }),
              "KVCache: append: k_new: data pointer is null but its shape (3, 1, 5) has elements");
    EXPECT_EQ(c.lengths(), (std::vector<std::int64_t>{2, 2}));
}

// A moved-from cache is empty and refuses every call (length() read an empty vector: a crash).
TEST(KVCache, MovedFromIsEmptyAndRefusesCalls) {
    KVCache a(config(DType::f32, 4));
    std::mt19937 rng(3);
    a.append(random_f32(Shape{2, 3, 2, 5}, rng), random_f32(Shape{2, 3, 2, 4}, rng));
    KVCache b(std::move(a));
    EXPECT_EQ(b.length(1), 2);
    EXPECT_EQ(a.batch(), 0);
    EXPECT_EQ(a.capacity(), 0);
    EXPECT_TRUE(a.lengths().empty());
    const std::string moved = "this cache was moved from (it holds no storage)";
    for (const auto& call : std::initializer_list<std::function<void()>>{
             [&] { (void)a.length(0); }, [&] { (void)a.max_length(); }, [&] { (void)a.keys(); },
             [&] { (void)a.values(); }, [&] { a.reserve(8); }, [&] { a.reset(); }, [&] { a.truncate_all(0); },
             [&] { a.append(random_f32(Shape{2, 3, 1, 5}, rng), random_f32(Shape{2, 3, 1, 4}, rng)); }}) {
        const std::string e = error_of(call);
        EXPECT_NE(e.find(moved), std::string::npos) << e;
    }
    // Each call names itself (reset(b) and truncate said "length:").
    EXPECT_EQ(error_of([&] { a.reset(0); }), "KVCache: reset: " + moved);
    EXPECT_EQ(error_of([&] { a.truncate(0, 0); }), "KVCache: truncate: " + moved);
    // decode_attention says so too (it said "Q: batch 2 does not match the cache's batch 0").
    const Tensor q = random_f32(Shape{2, 3, 1, 5}, rng), o(DType::f32, Shape{2, 3, 1, 4});
    EXPECT_EQ(error_of([&] { decode_attention(q, a, {}, o); }), "decode_attention: cache: holds no storage (it was moved from)");
    KVCache c(config(DType::f32, 4));
    c = std::move(b);  // move assignment: c takes b's tokens, b is empty
    EXPECT_EQ(c.length(0), 2);
    EXPECT_EQ(b.batch(), 0);
    EXPECT_NE(error_of([&] { (void)b.max_length(); }).find(moved), std::string::npos);
    a = std::move(c);  // a moved-from cache is usable again once assigned
    EXPECT_EQ(a.max_length(), 2);
}

// ---- sizes (issue 19, class 1) ------------------------------------------------------------
// Capacities, limits, batch × heads and growth whose bytes cannot be counted are an attn::Error
// before anything is allocated; a countable size the system refuses is attn::OutOfMemory
// naming the buffer and the bytes. Either way the cache is left as it was. (This binary also
// runs under ASan + UBSan: tests/kernels/asan_kernel_tests.sh.)

constexpr std::int64_t kBig = std::int64_t{1} << 62;

KVCacheConfig single(std::int64_t cap, std::int64_t head_dim = 64, DType dt = DType::f32, bool grow = false) {
    KVCacheConfig c;
    c.head_dim = head_dim;
    c.capacity = cap;
    c.storage = dt;
    c.grow = grow;
    return c;
}

template <class F>
std::string oom_of(F&& f) {
    try {
        f();
    } catch (const OutOfMemory& e) {
        return e.what();
    }
    return "(no OutOfMemory)";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(KVCacheSizes, UncountableSizesAreErrorsBeforeAllocating) {
    EXPECT_EQ(error_of([] { KVCache c(single(kBig)); }),
              "KVCache: capacity 4611686018427387904: keys (B, Hkv, capacity, Dk) of shape (1, 1, 4611686018427387904, "
              "64) with 4-byte elements needs more bytes than a 64-bit size can count (1 × 1 × 4611686018427387904 × 64 × "
              "4 > 9223372036854775807)");
    KVCacheConfig values_only = single(std::int64_t{1} << 30, 1);
    values_only.value_dim = std::int64_t{1} << 40;
    KVCacheConfig heads = single(1, 1);
    heads.batch = heads.kv_heads = std::int64_t{1} << 40;  // batch × heads alone overflows
    KVCacheConfig heads16 = single(1, 1, DType::f16);
    heads16.batch = heads16.kv_heads = std::int64_t{1} << 31;  // fits as elements, not as bytes
    KVCacheConfig limit = single(4, 64, DType::f32, true);
    limit.max_capacity = kBig;  // a limit the cache could never reach
    const std::vector<std::pair<KVCacheConfig, std::string>> cases = {
        {single(kBig, 64, DType::f32, true), "capacity 4611686018427387904: keys"},
        {single(std::int64_t{1} << 58, 64, DType::bf16), "keys (B, Hkv, capacity, Dk) of shape (1, 1, 288230376151711744, 64)"},
        {single(std::numeric_limits<std::int64_t>::max(), 1, DType::f16), "capacity 9223372036854775807: keys"},
        {values_only, "capacity 1073741824: values (B, Hkv, capacity, Dv) of shape (1, 1, 1073741824, 1099511627776)"},
        {heads, "keys (B, Hkv, capacity, Dk) of shape (1099511627776, 1099511627776, 1, 1)"},
        {heads16, "(2147483648 × 2147483648 × 1 × 1 × 2 > 9223372036854775807)"},
        {limit, "KVCache: max_capacity 4611686018427387904: keys"},
    };
    for (const auto& [cfg, expect] : cases) {
        const std::string e = error_of([&cfg = cfg] { KVCache c(cfg); });
        EXPECT_TRUE(has(e, expect)) << e;
        EXPECT_TRUE(has(e, "more bytes than a 64-bit size can count")) << e;
    }
}

TEST(KVCacheSizes, RefusedAllocationNamesTheBufferAndTheBytes) {
    // 2^40 positions × 64 × 4 bytes = 256 TiB: countable, more than any address space gives.
    for (bool grow : {false, true}) {
        const std::string e = oom_of([&] { KVCache c(single(std::int64_t{1} << 40, 64, DType::f32, grow)); });
        EXPECT_EQ(e, "out of memory: cannot allocate 281474976710656 bytes (256.0 TiB) for KVCache keys (B, Hkv, "
                     "capacity, Dk) = (1, 1, 1099511627776, 64) float32");
    }
    // Keys fit, values do not: the keys buffer is released (ASan's leak check), values named.
    KVCacheConfig cfg = single(std::int64_t{1} << 20, 1);
    cfg.value_dim = std::int64_t{1} << 26;
    EXPECT_TRUE(has(oom_of([&] { KVCache c(cfg); }), "for KVCache values (B, Hkv, capacity, Dv) = (1, 1, 1048576, 67108864)"));
}

TEST(KVCacheSizes, FailedReserveOrGrowthLeavesTheCacheAsItWas) {
    std::mt19937 rng(16);
    KVCache c(config(DType::f16, 4, true));
    const Tensor k1 = random_f32(Shape{2, 3, 3, 5}, rng), v1 = random_f32(Shape{2, 3, 3, 4}, rng);
    c.append(k1, v1);
    const auto unchanged = [&] {
        EXPECT_EQ(c.capacity(), 4);
        EXPECT_EQ(c.length(0), 3);
        EXPECT_EQ(c.length(1), 3);
        expect_rows(c, c.keys(), 1, 0, k1, 1);
        expect_rows(c, c.values(), 0, 0, v1, 0);
    };
    EXPECT_TRUE(has(error_of([&] { c.reserve(kBig); }), "KVCache: reserve: capacity 4611686018427387904: keys"));
    unchanged();
    EXPECT_TRUE(has(oom_of([&] { c.reserve(std::int64_t{1} << 50); }), "out of memory: cannot allocate"));
    unchanged();
    // Appends of T tokens from a broadcast view (stride 0: any T costs no memory).
    const float zero[5] = {};
    const auto kview = [&](std::int64_t T) {
        return TensorView(const_cast<float*>(zero), DType::f32, Shape{2, 3, T, 5}, Strides{0, 0, 0, 1});
    };
    const auto vview = [&](std::int64_t T) {
        return TensorView(const_cast<float*>(zero), DType::f32, Shape{2, 3, T, 4}, Strides{0, 0, 0, 1});
    };
    EXPECT_TRUE(has(error_of([&] { c.append(kview(kBig), vview(kBig)); }),
                    "KVCache: append: capacity 4611686018427387907: keys (B, Hkv, capacity, Dk)"));
    unchanged();
    EXPECT_TRUE(has(oom_of([&] { c.append(kview(std::int64_t{1} << 42), vview(std::int64_t{1} << 42)); }),
                    "out of memory: cannot allocate"));
    unchanged();
    const std::int64_t max = std::numeric_limits<std::int64_t>::max();
    EXPECT_EQ(error_of([&] { c.append(kview(max), vview(max)); }),
              "KVCache: append: length of sequence 0 + new tokens: 3 + 9223372036854775807 exceeds 9223372036854775807");
    const TensorView k_seq(const_cast<float*>(zero), DType::f32, Shape{3, max, 5}, Strides{0, 0, 1});
    const TensorView v_seq(const_cast<float*>(zero), DType::f32, Shape{3, max, 4}, Strides{0, 0, 1});
    EXPECT_EQ(error_of([&] { c.append(1, k_seq, v_seq); }),
              "KVCache: append: length of sequence 1 + new tokens: 3 + 9223372036854775807 exceeds 9223372036854775807");
    unchanged();
    // And the cache still works: 2 more tokens grow it by doubling, contents kept.
    const Tensor k2 = random_f32(Shape{2, 3, 2, 5}, rng), v2 = random_f32(Shape{2, 3, 2, 4}, rng);
    c.append(k2, v2);
    EXPECT_EQ(c.capacity(), 8);
    expect_rows(c, c.keys(), 1, 0, k1, 1);
    expect_rows(c, c.keys(), 0, 3, k2, 0);
    expect_rows(c, c.values(), 1, 3, v2, 1);
}

// require_room throws what the append would. A growth to positions whose bytes cannot be
// counted (a growing cache without max_capacity) was found by grow_for only, inside the append:
// after the work require_room is there to spare (MultiHeadAttention::forward_incremental's QKV
// projection) — it said nothing.
TEST(KVCacheSizes, RequireRoomRefusesAGrowthWhoseBytesCannotBeCounted) {
    std::mt19937 rng(18);
    KVCache c(config(DType::f16, 4, true));
    c.append(random_f32(Shape{2, 3, 3, 5}, rng), random_f32(Shape{2, 3, 3, 4}, rng));
    const std::string want =
        "KVCache: append: capacity 4611686018427387907: keys (B, Hkv, capacity, Dk) of shape (2, 3, "
        "4611686018427387907, 5) with 2-byte elements needs more bytes than a 64-bit size can count (2 × 3 × "
        "4611686018427387907 × 5 × 2 > 9223372036854775807)";
    EXPECT_EQ(error_of([&] { c.require_room(kBig); }), want);
    const float zero[5] = {};
    const TensorView k(const_cast<float*>(zero), DType::f32, Shape{2, 3, kBig, 5}, Strides{0, 0, 0, 1});
    const TensorView v(const_cast<float*>(zero), DType::f32, Shape{2, 3, kBig, 4}, Strides{0, 0, 0, 1});
    EXPECT_EQ(error_of([&] { c.append(k, v); }), want);
    // A growth it can count passes, and leaves the cache as it was (require_room changes nothing).
    EXPECT_EQ(error_of([&] { c.require_room(2); }), "(no error)");
    EXPECT_EQ(c.capacity(), 4);
    EXPECT_EQ(c.lengths(), (std::vector<std::int64_t>{3, 3}));
}

TEST(KVCacheSizes, WithoutGrowthAHugeAppendIsRefused) {
    // Before the checks, 1 + INT64_MAX wrapped negative, "fitted", and the append wrote far
    // past the buffer.
    KVCache c(config(DType::f32, 4));
    std::mt19937 rng(17);
    c.append(random_f32(Shape{2, 3, 1, 5}, rng), random_f32(Shape{2, 3, 1, 4}, rng));
    const float zero[5] = {};
    for (std::int64_t T : {std::numeric_limits<std::int64_t>::max(), kBig, std::int64_t{1} << 40}) {
        const TensorView k(const_cast<float*>(zero), DType::f32, Shape{2, 3, T, 5}, Strides{0, 0, 0, 1});
        const TensorView v(const_cast<float*>(zero), DType::f32, Shape{2, 3, T, 4}, Strides{0, 0, 0, 1});
        EXPECT_NE(error_of([&] { c.append(k, v); }), "(no error)") << T;
        EXPECT_EQ(c.max_length(), 1);
    }
}

}  // namespace
}  // namespace attn::test
