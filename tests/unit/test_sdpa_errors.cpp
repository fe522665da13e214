// Argument checks of attn::sdpa (src/sdpa/validate.cpp) and the option parsers: each check is
// triggered once; the message must name the argument, the expectation and what was given, and
// the poisoned outputs must be untouched (nothing is written before every check has passed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <limits>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/reference.hpp"
#include "attn/sdpa.hpp"
#include "attn/threads.hpp"
#include "common/address_space.hpp"
#include "naive_attention.hpp"

namespace {

using namespace attn_test;
using attn::Causal;
using attn::Impl;
using attn::SdpaOptions;

// B = 2, Hq = 4, Hkv = 2, Lq = 5, Lk = 7, Dk = 8, Dv = 6.
struct Call {
    Tensor q = random_tensor(DType::f32, Shape{2, 4, 5, 8}, 1);
    Tensor k = random_tensor(DType::f32, Shape{2, 2, 7, 8}, 2);
    Tensor v = random_tensor(DType::f32, Shape{2, 2, 7, 6}, 3);
    Tensor out{DType::f32, Shape{2, 4, 5, 6}};
    Tensor lse{DType::f32, Shape{2, 4, 5}};
    Tensor weights{DType::f32, Shape{2, 4, 5, 7}};
    TensorView qv = q, kv = k, vv = v, outv = out, lsev = lse, wv = weights;
    SdpaOptions opt;
    bool pass_lse = true, pass_weights = true;

    Call() {
        poison(out);
        poison(lse);
        poison(weights);
        opt.impl = Impl::reference;
    }
    std::optional<attn::ScoresOutput> scores;  // passed when set
    void run() {
        attn::sdpa(qv, kv, vv, opt, outv, pass_lse ? &lsev : nullptr, pass_weights ? &wv : nullptr, nullptr,
                   scores ? &*scores : nullptr);
    }
};

// Applies `setup` to a valid call, runs it, expects attn::Error whose message contains every
// fragment, and checks that no output byte changed.
void expect_error(const std::function<void(Call&)>& setup, std::initializer_list<std::string> fragments) {
    Call c;
    setup(c);
    std::string msg;
    try {
        c.run();
        ADD_FAILURE() << "expected attn::Error containing '" << *fragments.begin() << "'";
        return;
    } catch (const attn::Error& e) {
        msg = e.what();
    }
    for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
    EXPECT_TRUE(still_poisoned(c.out)) << "out written before the error: " << msg;
    EXPECT_TRUE(still_poisoned(c.lse)) << "lse written before the error: " << msg;
    EXPECT_TRUE(still_poisoned(c.weights)) << "weights written before the error: " << msg;
}

TEST(SdpaErrors, TheValidCallWorks) {
    Call c;
    c.run();
    EXPECT_FALSE(still_poisoned(c.out));
    for (std::int64_t n = 0; n < c.out.numel(); ++n) EXPECT_TRUE(std::isfinite(c.out.data_as<float>()[n]));
}

// sdpa_output_shapes: the outputs' shapes for valid inputs, and sdpa's own error for bad ones
// (what the CLI asks before it allocates the outputs).
TEST(SdpaErrors, OutputShapesAfterTheSameChecks) {
    Call c;
    const attn::SdpaShapes s = attn::sdpa_output_shapes(c.qv, c.kv, c.vv);
    EXPECT_EQ(s.out, (Shape{2, 4, 5, 6}));
    EXPECT_EQ(s.lse, (Shape{2, 4, 5}));
    EXPECT_EQ(s.weights, (Shape{2, 4, 5, 7}));
    const TensorView k3(c.k.data(), DType::f32, Shape{2, 3, 7, 8});  // Hq 4 not a multiple of 3
    for (auto call : {std::function<void()>([&] { (void)attn::sdpa_output_shapes(c.qv, k3, c.vv); }),
                      std::function<void()>([&] { attn::sdpa(c.qv, k3, c.vv, c.opt, c.outv); })}) {
        try {
            call();
            ADD_FAILURE() << "no error";
        } catch (const attn::Error& e) {
            EXPECT_NE(std::string(e.what()).find("sdpa: V: heads 2 do not match K's heads 3"), std::string::npos) << e.what();
        }
    }
}

// An output sharing memory with an input or with another output is refused before anything is
// written: the kernels write out, lse and weights while they still read the rest.
TEST(SdpaErrors, OutputsOverlappingInputsOrEachOther) {
    expect_error([](Call& c) { c.outv = c.q.view().slice(3, 0, 6); }, {"sdpa: out: must not share memory with Q"});
    expect_error([](Call& c) { c.lsev = TensorView(c.out.data(), DType::f32, Shape{2, 4, 5}); },
                 {"sdpa: out: must not share memory with lse"});
    // (Every view lies inside the tensor it aliases.)
    expect_error([](Call& c) { c.outv = TensorView(c.weights.data(), DType::f32, Shape{2, 4, 5, 6}); },
                 {"sdpa: out: must not share memory with weights"});
    expect_error([](Call& c) { c.lsev = TensorView(c.weights.data(), DType::f32, Shape{2, 4, 5}); },
                 {"sdpa: lse: must not share memory with weights"});
    expect_error([](Call& c) { c.opt.bool_mask = TensorView(c.weights.data(), DType::boolean, Shape{5, 7}); },
                 {"sdpa: weights: must not share memory with bool_mask"});
    expect_error([](Call& c) { c.opt.additive_mask = TensorView(c.out.data(), DType::f32, Shape{5, 7}); },
                 {"sdpa: out: must not share memory with additive_mask"});
    // Scores too, against the inputs as against the other outputs.
    expect_error([](Call& c) { c.scores = attn::ScoresOutput{TensorView(c.q.data(), DType::f32, Shape{2, 4, 5, 7})}; },
                 {"sdpa: scores: must not share memory with Q"});
}

// Rows that interleave without sharing an element are apart (the check is not only address
// ranges): Q and out as the two parts of each row of one (B, Hq, Lq, 14) buffer run and give
// the result of separate tensors; shifted by one element into Q's columns, they are refused.
TEST(SdpaErrors, InterleavedRowsThatDoNotMeetAreAccepted) {
    Call c;
    Tensor buf = random_tensor(DType::f32, Shape{2, 4, 5, 14}, 9);
    const TensorView q = buf.view().slice(3, 0, 8), out = buf.view().slice(3, 8, 6);
    const Tensor q_copy = attn::to_dtype(q, DType::f32);
    attn::sdpa(q_copy, c.k, c.v, c.opt, c.out);  // the same problem, separate tensors
    attn::sdpa(q, c.k, c.v, c.opt, out);
    for (std::int64_t i = 0; i < c.out.numel(); ++i) {
        const std::int64_t row = i / 6, col = i % 6;
        ASSERT_EQ(out.data_as<float>()[row * 14 + col], c.out.data_as<float>()[i]) << i;
    }
    try {
        attn::sdpa(q, c.k, c.v, c.opt, buf.view().slice(3, 7, 6));
        ADD_FAILURE() << "out overlapping Q's last column was accepted";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("sdpa: out: must not share memory with Q"), std::string::npos) << e.what();
    }
}

TEST(SdpaErrors, NullData) {
    expect_error([](Call& c) { c.qv = TensorView(nullptr, DType::f32, Shape{2, 4, 5, 8}); }, {"sdpa: Q: data pointer is null"});
    expect_error([](Call& c) { c.kv = TensorView(nullptr, DType::f32, Shape{2, 2, 7, 8}); }, {"sdpa: K: data pointer is null"});
    expect_error([](Call& c) { c.vv = TensorView(nullptr, DType::f32, Shape{2, 2, 7, 6}); }, {"sdpa: V: data pointer is null"});
    expect_error([](Call& c) { c.outv = TensorView(); }, {"sdpa: out: data pointer is null"});
    expect_error([](Call& c) { c.lsev = TensorView(); }, {"sdpa: lse: data pointer is null"});
    expect_error([](Call& c) { c.wv = TensorView(); }, {"sdpa: weights: data pointer is null"});
}

TEST(SdpaErrors, MisalignedData) {
    // A float32 view starting 2 bytes into a buffer (ring attention's V did, after an odd number
    // of float16 K elements): undefined behaviour to read through a float*, so refused first.
    static const Tensor spare(DType::f32, Shape{1024});
    void* const odd = static_cast<char*>(spare.data()) + 2;
    expect_error([&](Call& c) { c.vv = TensorView(odd, DType::f32, Shape{2, 2, 7, 6}); },
                 {"sdpa: V: data pointer ", " is not a multiple of its 4-byte float32 elements (misaligned)"});
    expect_error([&](Call& c) { c.qv = TensorView(odd, DType::f32, Shape{2, 4, 5, 8}); }, {"sdpa: Q: data pointer "});
    expect_error([&](Call& c) { c.lsev = TensorView(odd, DType::f32, Shape{2, 4, 5}); },
                 {"sdpa: lse: data pointer ", "(misaligned)"});
    // float16 needs 2-byte alignment only.
    Call c;
    const Tensor k16(DType::f16, Shape{2 * 2 * 7 * 8 + 1});
    const TensorView k16_view(static_cast<char*>(k16.data()) + 2, DType::f16, Shape{2, 2, 7, 8});
    c.kv = k16_view;
    EXPECT_NO_THROW(c.run());
}

TEST(SdpaErrors, Ranks) {
    expect_error([](Call& c) { c.qv = TensorView(c.q.data(), DType::f32, Shape{4, 5, 8}); },
                 {"sdpa: Q: expected a rank-4 tensor (B, Hq, Lq, Dk) but got shape (4, 5, 8)"});
    expect_error([](Call& c) { c.kv = TensorView(c.k.data(), DType::f32, Shape{112}); },
                 {"sdpa: K: expected a rank-4 tensor (B, Hkv, Lk, Dk) but got shape (112,)"});
    expect_error([](Call& c) { c.vv = TensorView(c.v.data(), DType::f32, Shape{}); },
                 {"sdpa: V: expected a rank-4 tensor (B, Hkv, Lk, Dv) but got shape ()"});
    expect_error([](Call& c) { c.outv = TensorView(c.out.data(), DType::f32, Shape{8, 5, 6}); },
                 {"sdpa: out: expected a rank-4 tensor (B, Hq, Lq, Dv) but got shape (8, 5, 6)"});
    expect_error([](Call& c) { c.lsev = TensorView(c.lse.data(), DType::f32, Shape{2, 4, 5, 1}); },
                 {"sdpa: lse: expected a rank-3 tensor (B, Hq, Lq) but got shape (2, 4, 5, 1)"});
    expect_error([](Call& c) { c.wv = TensorView(c.weights.data(), DType::f32, Shape{8, 5, 7}); },
                 {"sdpa: weights: expected a rank-4 tensor (B, Hq, Lq, Lk) but got shape (8, 5, 7)"});
}

TEST(SdpaErrors, Dtypes) {
    expect_error([](Call& c) { c.qv = TensorView(c.q.data(), DType::i64, Shape{2, 4, 5, 8}); },
                 {"sdpa: Q: dtype must be float32, float64, float16 or bfloat16 but got int64"});
    expect_error([](Call& c) { c.kv = TensorView(c.k.data(), DType::i32, Shape{2, 2, 7, 8}); },
                 {"sdpa: K: dtype must be float32, float64, float16 or bfloat16 but got int32"});
    // 16-bit Q/K/V in any combination are not an error: decode or flash runs them (tests/half).
    expect_error([](Call& c) { c.outv = TensorView(c.out.data(), DType::i32, Shape{2, 4, 5, 6}); },
                 {"sdpa: out: dtype must be float32, float64, float16 or bfloat16 but got int32"});
    expect_error([](Call& c) { c.lsev = TensorView(c.lse.data(), DType::f16, Shape{2, 4, 5}); },
                 {"sdpa: lse: dtype must be float32 or float64 but got float16"});
    expect_error([](Call& c) { c.lsev = TensorView(c.lse.data(), DType::i32, Shape{2, 4, 5}); },
                 {"sdpa: lse: dtype must be float32 or float64 but got int32"});
    expect_error([](Call& c) { c.wv = TensorView(c.weights.data(), DType::boolean, Shape{2, 4, 5, 7}); },
                 {"sdpa: weights: dtype must be float32 or float64 but got bool"});
}

TEST(SdpaErrors, EmptyDimensions) {
    expect_error([](Call& c) { c.qv = c.q.view().slice(0, 0, 0); }, {"sdpa: Q: batch must be >= 1 but got 0"});
    expect_error([](Call& c) { c.qv = c.q.view().slice(2, 0, 0); }, {"sdpa: Q: length must be >= 1 but got 0"});
    expect_error([](Call& c) { c.kv = c.k.view().slice(1, 0, 0); }, {"sdpa: K: heads must be >= 1 but got 0"});
    expect_error([](Call& c) { c.kv = c.k.view().slice(2, 0, 0); c.vv = c.v.view().slice(2, 0, 0); },
                 {"sdpa: K: length must be >= 1 but got 0"});
    expect_error([](Call& c) { c.vv = c.v.view().slice(3, 0, 0); }, {"sdpa: V: head dim must be >= 1 but got 0"});
    // An empty tensor's data pointer may be null (torch's is): the zero dim is still the reason
    // given (it said "Q: data pointer is null").
    expect_error([](Call& c) { c.qv = TensorView(nullptr, DType::f32, Shape{2, 4, 0, 8}); }, {"sdpa: Q: length must be >= 1 but got 0"});
    expect_error([](Call& c) { c.kv = TensorView(nullptr, DType::f32, Shape{0, 2, 7, 8}); }, {"sdpa: K: batch must be >= 1 but got 0"});
    expect_error([](Call& c) { c.vv = TensorView(nullptr, DType::f32, Shape{2, 2, 7, 0}); }, {"sdpa: V: head dim must be >= 1 but got 0"});
    // A wrong rank is the first thing wrong with an empty tensor, whatever its pointer (it said
    // "Q: data pointer is null").
    expect_error([](Call& c) { c.qv = TensorView(nullptr, DType::f32, Shape{2, 0, 8}); },
                 {"sdpa: Q: expected a rank-4 tensor (B, Hq, Lq, Dk) but got shape (2, 0, 8)"});
    expect_error([](Call& c) { c.kv = TensorView(nullptr, DType::f32, Shape{0, 8}); },
                 {"sdpa: K: expected a rank-4 tensor (B, Hkv, Lk, Dk) but got shape (0, 8)"});
}

TEST(SdpaErrors, ShapeMismatches) {
    expect_error([](Call& c) { c.kv = c.k.view().slice(0, 0, 1); }, {"sdpa: K: batch 1 does not match Q's batch 2"});
    expect_error([](Call& c) { c.vv = c.v.view().slice(0, 1, 1); }, {"sdpa: V: batch 1 does not match Q's batch 2"});
    expect_error([](Call& c) { c.kv = c.k.view().slice(3, 0, 5); }, {"sdpa: K: head dim 5 does not match Q's head dim 8"});
    expect_error([](Call& c) { c.vv = c.v.view().slice(1, 0, 1); }, {"sdpa: V: heads 1 do not match K's heads 2"});
    expect_error([](Call& c) { c.vv = c.v.view().slice(2, 0, 6); }, {"sdpa: V: length 6 does not match K's length 7"});
    expect_error([](Call& c) { c.qv = c.q.view().slice(1, 0, 3); },
                 {"sdpa: Q: heads 3 must be a multiple of K/V's heads 2 (grouped-query attention)"});
}

TEST(SdpaErrors, OutputShapes) {
    expect_error([](Call& c) { c.outv = c.out.view().slice(3, 0, 5); },
                 {"sdpa: out: expected shape (B, Hq, Lq, Dv) = (2, 4, 5, 6) but got (2, 4, 5, 5)"});
    expect_error([](Call& c) { c.lsev = c.lse.view().slice(1, 0, 2); },
                 {"sdpa: lse: expected shape (B, Hq, Lq) = (2, 4, 5) but got (2, 2, 5)"});
    expect_error([](Call& c) { c.wv = c.weights.view().slice(3, 0, 6); },
                 {"sdpa: weights: expected shape (B, Hq, Lq, Lk) = (2, 4, 5, 7) but got (2, 4, 5, 6)"});
}

TEST(SdpaErrors, Scale) {
    expect_error([](Call& c) { c.opt.scale = std::numeric_limits<double>::quiet_NaN(); }, {"sdpa: scale: must be finite in float32 (|scale| <= 3.4028235e38) but got nan"});
    expect_error([](Call& c) { c.opt.scale = -kInf; }, {"sdpa: scale: must be finite in float32 (|scale| <= 3.4028235e38) but got -inf"});
    // Just above FLT_MAX: every digit that shows it (6 digits printed 3.40282e+38, which looks valid).
    expect_error([](Call& c) { c.opt.scale = 3.4028236e38; },
                 {"sdpa: scale: must be finite in float32 (|scale| <= 3.4028235e38) but got 3.4028236e+38"});
    // Non-zero as a double, 0 as the float32 the kernels multiply by: every score would be 0 (uniform
    // weights) where the caller asked for a scale. 2^-150 is the tie that rounds to even, 0. A
    // float32 subnormal carries the scale with fewer bits (docs/conventions.md): a normal float32, or 0.
    const std::string normal = "sdpa: scale: must be 0 or a normal float32 (|scale| >= 2^-126 ≈ 1.1754944e-38 there) but got ";
    expect_error([](Call& c) { c.opt.scale = 1e-50; }, {normal + "1e-50, which rounds to 0"});
    expect_error([](Call& c) { c.opt.scale = -std::ldexp(1.0, -150); }, {normal + "-7.006492321624085e-46, which rounds to 0"});
    expect_error([](Call& c) { c.opt.scale = 1e-40; }, {normal + "1e-40, a float32 subnormal"});
    expect_error([](Call& c) { c.opt.scale = -std::nextafter(std::ldexp(1.0, -150), 1.0); },
                 {normal + "-7.006492321624087e-46, a float32 subnormal"});
    // The largest subnormal (2^-126 - 2^-149) and the largest double below the tie with FLT_MIN.
    expect_error([](Call& c) { c.opt.scale = std::ldexp(1.0, -126) - std::ldexp(1.0, -149); }, {normal, "a float32 subnormal"});
    expect_error([](Call& c) { c.opt.scale = std::nextafter(std::ldexp(1.0, -126) - std::ldexp(1.0, -150), 0.0); },
                 {normal, "a float32 subnormal"});
    // FLT_MIN, the tie below it that rounds to it (even), and 0 itself, run.
    for (const double ok : {std::ldexp(1.0, -126), -std::ldexp(1.0, -126), std::ldexp(1.0, -126) - std::ldexp(1.0, -150), 0.0,
                            -0.0}) {
        Call c;
        c.opt.scale = ok;
        EXPECT_NO_THROW(c.run()) << ok;
        EXPECT_FALSE(still_poisoned(c.out)) << ok;
    }
}

TEST(SdpaErrors, BoolMask) {
    static Tensor m8 = random_bool(Shape{2, 1, 5, 7}, 9, 0.5);
    expect_error([](Call& c) { c.opt.bool_mask = TensorView(); }, {"sdpa: bool_mask: data pointer is null"});
    expect_error([](Call& c) { c.opt.bool_mask = TensorView(m8.data(), DType::i32, Shape{7}); },
                 {"sdpa: bool_mask: dtype must be bool (true = may attend) but got int32"});
    expect_error([](Call& c) { c.opt.bool_mask = TensorView(m8.data(), DType::boolean, Shape{2, 1, 1, 5}); },
                 {"sdpa: bool_mask: shape (2, 1, 1, 5) cannot be broadcast to (2, 4, 5, 7)", "dimension 3 is 5, expected 1 or 7"});
}

TEST(SdpaErrors, AdditiveMask) {
    static Tensor f = random_tensor(DType::f32, Shape{2, 4, 5, 7}, 10);
    expect_error([](Call& c) { c.opt.additive_mask = TensorView(); }, {"sdpa: additive_mask: data pointer is null"});
    expect_error([](Call& c) { c.opt.additive_mask = TensorView(f.data(), DType::i32, Shape{5, 7}); },
                 {"sdpa: additive_mask: dtype must be float32, float64, float16 or bfloat16 but got int32"});
    expect_error([](Call& c) { c.opt.additive_mask = TensorView(f.data(), DType::f16, Shape{3, 1, 5, 7}); },
                 {"sdpa: additive_mask: shape (3, 1, 5, 7) cannot be broadcast to (2, 4, 5, 7)"});
    expect_error([](Call& c) { c.opt.additive_mask = TensorView(f.data(), DType::f32, Shape{3, 1, 5, 7}); },
                 {"sdpa: additive_mask: shape (3, 1, 5, 7) cannot be broadcast to (2, 4, 5, 7)"});
}

// The kind of a call's error (attn::ErrorKind: Python raises TypeError or ValueError by it).
attn::ErrorKind kind_of(const std::function<void(Call&)>& setup) {
    Call c;
    setup(c);
    try {
        c.run();
    } catch (const attn::Error& e) {
        return e.kind();
    }
    ADD_FAILURE() << "expected an attn::Error";
    return attn::ErrorKind::value;
}

// Given where the error is raised: a dtype the argument does not take is ErrorKind::type, any other
// refusal of the same argument ErrorKind::value.
TEST(SdpaErrors, KindIsTypeForADtypeAndValueOtherwise) {
    using attn::ErrorKind;
    static Tensor m8 = random_bool(Shape{2, 1, 5, 7}, 9, 0.5);
    static float fl[2] = {3, 7};
    static std::int32_t one[1] = {3};
    EXPECT_EQ(kind_of([](Call& c) { c.kv = TensorView(c.k.data(), DType::i32, Shape{2, 2, 7, 8}); }), ErrorKind::type);
    EXPECT_EQ(kind_of([](Call& c) { c.kv = c.k.view().slice(3, 0, 4); }), ErrorKind::value);
    EXPECT_EQ(kind_of([](Call& c) { c.lsev = TensorView(c.lse.data(), DType::f16, Shape{2, 4, 5}); }), ErrorKind::type);
    EXPECT_EQ(kind_of([](Call& c) { c.opt.bool_mask = TensorView(m8.data(), DType::i32, Shape{7}); }), ErrorKind::type);
    EXPECT_EQ(kind_of([](Call& c) { c.opt.bool_mask = TensorView(m8.data(), DType::boolean, Shape{2, 1, 1, 5}); }),
              ErrorKind::value);
    EXPECT_EQ(kind_of([](Call& c) { c.opt.additive_mask = TensorView(m8.data(), DType::boolean, Shape{5, 7}); }),
              ErrorKind::type);
    EXPECT_EQ(kind_of([](Call& c) { c.opt.key_lengths = TensorView(fl, DType::f32, Shape{2}); }), ErrorKind::type);
    EXPECT_EQ(kind_of([](Call& c) { c.opt.key_lengths = TensorView(one, DType::i32, Shape{1}); }), ErrorKind::value);
    EXPECT_EQ(kind_of([](Call& c) { c.opt.scale = 1e39; }), ErrorKind::value);
}

TEST(SdpaErrors, KeyLengths) {
    static std::int32_t ok[2] = {3, 7};
    static std::int32_t neg[2] = {3, -1};
    static std::int64_t big[2] = {8, 7};
    static float fl[2] = {3, 7};
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(); }, {"sdpa: key_lengths: data pointer is null"});
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(fl, DType::f32, Shape{2}); },
                 {"sdpa: key_lengths: dtype must be int32 or int64 but got float32"});
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(ok, DType::i32, Shape{1}); },
                 {"sdpa: key_lengths: expected shape (B,) = (2,) but got (1,)"});
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(ok, DType::i32, Shape{2, 1}); },
                 {"sdpa: key_lengths: expected shape (B,) = (2,) but got (2, 1)"});
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(neg, DType::i32, Shape{2}); },
                 {"sdpa: key_lengths: entry 1 must be in [0, Lk=7] but got -1"});
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(big, DType::i64, Shape{2}); },
                 {"sdpa: key_lengths: entry 0 must be in [0, Lk=7] but got 8"});
}

TEST(SdpaErrors, KeyLengthsReportTheValueGiven) {
    // The value in the message is the integer given, even where a double cannot hold it.
    static std::int64_t huge[2] = {3, std::numeric_limits<std::int64_t>::max()};
    static std::int64_t low[2] = {std::numeric_limits<std::int64_t>::min(), 3};
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(huge, DType::i64, Shape{2}); },
                 {"sdpa: key_lengths: entry 1 must be in [0, Lk=7] but got 9223372036854775807"});
    expect_error([](Call& c) { c.opt.key_lengths = TensorView(low, DType::i64, Shape{2}); },
                 {"sdpa: key_lengths: entry 0 must be in [0, Lk=7] but got -9223372036854775808"});
}

TEST(SdpaErrors, OutputsWithStrideZeroWouldOverlap) {
    // A broadcast view as an output would write several results to one address.
    expect_error([](Call& c) { c.outv = c.out.view().slice(1, 0, 1).broadcast_to(Shape{2, 4, 5, 6}, "x"); },
                 {"sdpa: out: dimension 1 has stride 0 but size 4"});
    expect_error([](Call& c) { c.lsev = c.lse.view().slice(2, 0, 1).broadcast_to(Shape{2, 4, 5}, "x"); },
                 {"sdpa: lse: dimension 2 has stride 0 but size 5"});
    expect_error([](Call& c) { c.wv = c.weights.view().slice(3, 0, 1).broadcast_to(Shape{2, 4, 5, 7}, "x"); },
                 {"sdpa: weights: dimension 3 has stride 0 but size 7"});
}

// Nonzero strides can overlap as well: refused (they were accepted and written). The lse case
// has more elements than addresses (refused at once); the out case is found by marking offsets.
TEST(SdpaErrors, OutputsWithOverlappingStrides) {
    expect_error([](Call& c) { c.lsev = TensorView(c.lse.data(), DType::f32, Shape{2, 4, 5}, {1, 1, 1}); },
                 {"sdpa: lse: strides (1, 1, 1) for shape (2, 4, 5) put two elements at one address"});
    expect_error([](Call& c) { c.outv = TensorView(c.out.data(), DType::f32, Shape{2, 4, 5, 6}, {120, 30, 6, 2}); },
                 {"sdpa: out: strides (120, 30, 6, 2) for shape (2, 4, 5, 6) put two elements at one address"});
}

// One key more than the dropout counter's range: refused as a limit of every call, naming K
// (it was refused as "dropout_origin.key", an option nobody had set).
TEST(SdpaErrors, MoreKeysThanACallMayHave) {
    static float one = 1.0f;
    const std::int64_t Lk = (std::int64_t{1} << 34) + 1;
    expect_error(
        [&](Call& c) {
            c.kv = TensorView(&one, DType::f32, Shape{2, 2, Lk, 8}, attn::Strides{0, 0, 0, 0});
            c.vv = TensorView(&one, DType::f32, Shape{2, 2, Lk, 6}, attn::Strides{0, 0, 0, 0});
            c.pass_weights = false;
        },
                 {"sdpa: K: Lk = 17179869185 is more than a call may have (2^34, the range of the dropout counter"});
}

// Dropout without a seed: refused, naming dropout_seed and how C++ gives one (a default seed of 0
// was taken, and a caller who forgot it dropped the same weights on every call of every training
// step). Any given seed is one, 0 included.
TEST(SdpaErrors, DropoutNeedsASeed) {
    expect_error([](Call& c) { c.opt.dropout_p = 0.1; },
                 {"sdpa: dropout_seed: dropout_p = 0.1 needs a seed (dropout_seed = N, any std::uint64_t): the keep mask",
                  "a new seed each step and the backward the forward's"});
    Call c;
    c.opt.dropout_p = 0.1;
    c.opt.dropout_seed = 0;
    EXPECT_NO_THROW(c.run());
    Call undropped;  // a seed without dropout changes nothing
    undropped.opt.dropout_seed = 5;
    EXPECT_NO_THROW(undropped.run());
}

// Enum values cast from a wrong integer ran a default branch (Impl(77) the reference, Causal(9)
// bottom-right; an adversarial tester found them): refused, naming the field.
TEST(SdpaErrors, EnumValuesOutOfRange) {
    expect_error([](Call& c) { c.opt.impl = static_cast<Impl>(77); },
                 {"sdpa: impl: must be one of Impl::automatic, reference, flash, decode but got the value 77"});
    expect_error([](Call& c) { c.opt.causal = static_cast<Causal>(9); }, {"sdpa: causal: must be one of", "the value 9"});
    expect_error([](Call& c) { c.opt.window.align = static_cast<attn::Align>(-1); },
                 {"sdpa: window.align: must be one of", "the value -1"});
    expect_error(
        [](Call& c) {
            c.scores = attn::ScoresOutput{c.weights.view(), static_cast<attn::ScoreStage>(3)};
            c.pass_weights = false;
        },
        {"sdpa: scores.stage: must be one of ScoreStage::scaled, softcapped, masked but got the value 3"});
}

// Element offsets are distinct but the byte offsets (× 4, in 64 bits) wrap: a stride of 2^62
// floats put row 1 on row 0's bytes and was accepted (an adversarial tester found it). Refused,
// as is INT64_MIN (whose std::abs was undefined).
TEST(SdpaErrors, OutputsSpanningMoreThan2To63Bytes) {
    constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
    expect_error([](Call& c) { c.lsev = TensorView(c.lse.data(), DType::f32, Shape{2, 4, 5}, {20, 5, std::int64_t{1} << 62}); },
                 {"sdpa: lse: strides (20, 5, 4611686018427387904) for shape (2, 4, 5) span more than 2^63 bytes of float32"});
    expect_error([](Call& c) { c.lsev = TensorView(c.lse.data(), DType::f32, Shape{2, 4, 5}, {-(std::int64_t{1} << 61), 5, 1}); },
                 {"sdpa: lse: strides (-2305843009213693952, 5, 1) for shape (2, 4, 5) span more than 2^63 bytes"});
    expect_error([](Call& c) { c.outv = TensorView(c.out.data(), DType::f32, Shape{2, 4, 5, 6}, {kMin, 30, 6, 1}); },
                 {"sdpa: out: strides (-9223372036854775808, 30, 6, 1) for shape (2, 4, 5, 6) span more than 2^63 bytes"});
}

// A layout whose strides interleave without overlapping — lse (B=2, H=4, Lq=5) with element
// (b, h, i) at 36·b + 5·h + 4·i: distinct, though 5 < 4·(5 − 1) — is accepted and written like
// a contiguous one.
TEST(SdpaErrors, InterleavedOutputStridesThatDoNotOverlapAreAccepted) {
    Call c, plain;
    std::vector<float> buf(72, std::nanf(""));  // the largest offset is 36 + 15 + 16 = 67
    c.lsev = TensorView(buf.data(), DType::f32, Shape{2, 4, 5}, {36, 5, 4});
    c.run();
    plain.run();
    for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < 4; ++h)
            for (std::int64_t i = 0; i < 5; ++i)
                EXPECT_EQ(buf[static_cast<std::size_t>(36 * b + 5 * h + 4 * i)], plain.lse.data_as<float>()[(b * 4 + h) * 5 + i]);
}

TEST(SdpaErrors, OutputsOfSizeOneMayHaveAnyStride) {
    Call c;
    c.qv = c.q.view().slice(2, 0, 1);  // Lq = 1
    c.outv = TensorView(c.out.data(), DType::f32, Shape{2, 4, 1, 6}, {24, 6, 0, 1});
    c.lsev = TensorView(c.lse.data(), DType::f32, Shape{2, 4, 1}, {4, 1, 0, 0});
    c.wv = TensorView(c.weights.data(), DType::f32, Shape{2, 4, 1, 7}, {28, 7, 0, 1});
    c.run();
    EXPECT_TRUE(std::isfinite(c.out.data_as<float>()[0]));
}

TEST(SdpaErrors, Window) {
    expect_error([](Call& c) { c.opt.window.left = -2; },
                 {"sdpa: window: left and right must be >= 0, or -1 for unbounded, but got left=-2 right=-1"});
    expect_error([](Call& c) { c.opt.window.right = -5; }, {"but got left=-1 right=-5"});
}

// The same checks, named after reference_steps (they said "sdpa:").
TEST(SdpaErrors, ReferenceStepsChecksTheSameWay) {
    const Tensor q = random_tensor(DType::f64, Shape{1, 2, 3, 4}, 1);
    const Tensor k = random_tensor(DType::f64, Shape{1, 2, 3, 5}, 2);
    const Tensor v = random_tensor(DType::f64, Shape{1, 2, 3, 4}, 3);
    try {
        (void)attn::reference_steps(q, k, v, {});
        ADD_FAILURE() << "expected attn::Error";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("reference_steps: K: head dim 5 does not match Q's head dim 4"), std::string::npos) << e.what();
    }
    try {
        (void)attn::reference_steps(q, TensorView(k.data(), DType::f64, Shape{6, 5}), v, {});
        ADD_FAILURE() << "expected attn::Error";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("reference_steps: K: expected a rank-4 tensor"), std::string::npos) << e.what();
    }
}

TEST(OptionParsers, ImplAndCausalNames) {
    EXPECT_EQ(attn::parse_impl("auto"), Impl::automatic);
    EXPECT_EQ(attn::parse_impl("reference"), Impl::reference);
    EXPECT_EQ(attn::parse_causal("top-left"), Causal::top_left);
    EXPECT_EQ(attn::parse_causal("bottom-right"), Causal::bottom_right);
    EXPECT_EQ(attn::parse_causal("none"), Causal::none);
    for (Impl i : {Impl::automatic, Impl::reference, Impl::flash}) EXPECT_EQ(attn::parse_impl(attn::impl_name(i)), i);
    try {
        (void)attn::parse_impl("fast");
        ADD_FAILURE();
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("impl: expected one of auto, reference"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("but got 'fast'"), std::string::npos) << e.what();
    }
    try {
        (void)attn::parse_causal("top_left");
        ADD_FAILURE();
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("causal: expected top-left or bottom-right (or none) but got 'top_left'"),
                  std::string::npos)
            << e.what();
    }
    // A name the caller gave is shown through the one quoting rule (docs/errors.md, "Quoting"):
    // its own quote and a control byte escaped, so the message stays one unambiguous line.
    try {
        (void)attn::parse_causal(std::string_view("top'left\n\x1b[31m"));
        ADD_FAILURE();
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find(R"(but got 'top\'left\x0a\x1b[31m')"), std::string::npos) << e.what();
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
}

#if !defined(ATTN_TEST_SANITIZED_MEMORY)  // (the death tests below; see their comments)
// Runs the reference (q = k = v) in this child process once OpenMP's threads have started
// (their stacks are address space too) and its address space leaves `headroom` bytes: returns
// the attn::OutOfMemory's message; exits 4 when the call ran (the limit did not bite).
std::string reference_message_under_a_limit(const Tensor& q, Tensor& out, unsigned long headroom) {
    SdpaOptions opt;
    opt.impl = Impl::reference;
    {
        const Tensor small = random_tensor(DType::f64, Shape{1, 2, 4, 8}, 2);
        Tensor small_out{DType::f64, Shape{1, 2, 4, 8}};
        attn::sdpa(small, small, small, opt, small_out);
    }
    attn::test::limit_address_space(headroom);
    try {
        attn::sdpa(q, q, q, opt, out);
    } catch (const attn::OutOfMemory& e) {
        return e.what();
    }
    std::exit(4);
}

// The reference kernel's buffers hold a head's Lq × Lk scores four times in double: a
// std::bad_alloc must come out as attn::OutOfMemory, not std::terminate (an exception may not
// leave an OpenMP region; a review found the abort when they were allocated inside it). In a
// child process (a "threadsafe" death test) whose address space leaves ~64 MiB, less than one
// head's 128 MiB. Not under ASan, whose shadow memory cannot live under such a limit.
[[noreturn]] void reference_under_an_address_space_limit() {
    const Tensor q = random_tensor(DType::f64, Shape{1, 2, 2048, 8}, 1);
    Tensor out{DType::f64, Shape{1, 2, 2048, 8}};
    const std::string message = reference_message_under_a_limit(q, out, 64ul << 20);
    std::exit(message.find("reference kernel keeps one head's Lq x Lk = 2048 x 2048") == std::string::npos ? 3 : 0);
}

// Two threads, room for one head's buffers (32 MiB) but not two: the reference reserves every
// thread's before it writes, so out is as it was. It allocated per head inside the loop, and one
// thread wrote a whole head before the other's allocation failed (an out-of-memory test found
// 131072 of 524288 outputs written).
[[noreturn]] void reference_on_two_threads_under_a_limit() {
    const Tensor q = random_tensor(DType::f64, Shape{1, 4, 1024, 8}, 3);
    Tensor out{DType::f64, Shape{1, 4, 1024, 8}};
    poison(out);
    std::vector<unsigned char> before(out.nbytes());
    std::memcpy(before.data(), out.data(), before.size());
    attn::set_num_threads(2);
    (void)reference_message_under_a_limit(q, out, 48ul << 20);
    std::exit(std::memcmp(before.data(), out.data(), before.size()) == 0 ? 0 : 7);
}

// Broadcast (stride-0) float64 views so large that one head's Lq × Lk doubles exceed what a
// std::vector can hold (length_error) or 2^63 bytes: attn::OutOfMemory, its message counting
// the bytes without wrapping. Lq·Lk = 2^64 wrapped to 0 and the reference wrote through an empty
// vector (a segfault; an adversarial tester found it). (Not under ASan, which aborts on such a request.)
#if !defined(ATTN_TEST_SANITIZED_MEMORY)
TEST(SdpaErrors, ReferenceBeyondAnyAllocationIsOutOfMemory) {
    double one = 1.0;
    const std::int64_t Lk = std::int64_t{1} << 34;  // the most keys a call may have
    // Lq·Lk = 2^59 doubles (bad_alloc), 2^61 (above max_size: length_error) and 2^64 (wraps
    // int64 to 0). out is never written, so its 64 MiB … 2 GiB (float16) stay virtual.
    for (const std::int64_t Lq : {std::int64_t{1} << 25, std::int64_t{1} << 27, std::int64_t{1} << 30}) {
        const TensorView q(&one, DType::f64, Shape{1, 1, Lq, 1}, attn::Strides{0, 0, 0, 0});
        const TensorView kv(&one, DType::f64, Shape{1, 1, Lk, 1}, attn::Strides{0, 0, 0, 0});
        Tensor out_rows{DType::f16, Shape{1, 1, Lq, 1}};
        SdpaOptions opt;
        opt.impl = Impl::reference;
        try {
            attn::sdpa(q, kv, kv, opt, out_rows);
            ADD_FAILURE() << "no error for Lq = " << Lq;
        } catch (const attn::OutOfMemory& e) {
            EXPECT_NE(std::string(e.what()).find("more than 2^63 bytes per thread"), std::string::npos) << e.what();
        } catch (const attn::Error& e) {
            ADD_FAILURE() << "Lq = " << Lq << ": " << e.what();
        }
    }
}
#endif

TEST(SdpaErrorsDeathTest, ReferenceOutOfMemoryIsAnError) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    // Exit codes: 0 attn::OutOfMemory naming the buffer; 3 another message; 4 no error; 5 no limit.
    EXPECT_EXIT(reference_under_an_address_space_limit(), ::testing::ExitedWithCode(0), "");
    // 7: out was written in part.
    EXPECT_EXIT(reference_on_two_threads_under_a_limit(), ::testing::ExitedWithCode(0), "");
}
#endif

}  // namespace
