// bf16 compute (docs/conventions.md, "bf16 compute"): the flash forward with all-bfloat16
// Q, K, V on a CPU with AVX-512 BF16 runs Q·Kᵀ and P·V as vdpbf16ps on bf16 pairs
// (kernels/flash/bf16_dot.hpp), Pᵀ rounded to bf16. Checked against the double reference on
// the same bf16 inputs (the reference reads them exactly), on random shapes (odd head dims,
// odd key blocks, GQA, Lq < and > the 64-query block), every mask kind, softcap / ALiBi /
// sinks, dropout, a strided K head dim, lse and weights; 1 and 2 threads bit-identical.
//
// Bound, per element (first order; u = 2^-24, the float32 terms as in test_modifiers.cpp):
//   E       = (Dk+2)·u·scale·max_ij Σ_d|q_id k_jd| + c·(1.5e-7 + 4u) + 4u·max m_h·(Lq+Lk+64+|offset|)
//             + 8u·(S + max|mask| + max|σ|)      S = scale·max Σ|qk| + max m_h·(Lq+Lk+64+|offset|)
//   out     |ΔO_id| ≤ (2^-8 + 2ε)·(1 + 2^-7)·Σ_j w_ij|v_jd|  ← Pᵀ from the bf16 path's exp2
//                                                                 (relative error ε, in P and in
//                                                                 l) rounded to bf16 (2^-8)
//                     + (2E + (Lk+16)u)·max|V| + Lk·2^-125·max|V|   (float32; bf16 denormals → 0)
//   lse     |Δlse| ≤ E + (Lk+16)u + u·max|lse| + ε              (l sums the unrounded P)
//   weights |ΔP_ij| ≤ P_ij·(2E + (Lk+16)u + ε) + 2^-125            (the f32 pass from that l)
// ε = kExpErr = 1.05e-4, the bf16 path's exp2 (bf16_dot.hpp, exp2_bf16; checked below).
// w_ij are the reference's weights (after dropout, as they multiplied V).
//
// On a CPU with AMX-BF16 the products run as tdpbf16ps on AMX tiles (flash/amx_dot.hpp) with the
// same operands and the same bound; ctest runs this file a second time with
// ATTN_CPU_HIDE=amx_bf16 (tests/kernels/CMakeLists.txt), so the vdpbf16ps kernels stay tested there.
// Skipped with "skipped: CPU lacks avx512_bf16" where the CPU lacks it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/sdpa.hpp"
#include "common/util.hpp"
#include "core/cpu_features.hpp"
#include "kernels/flash/bf16_dot.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "sdpa/problem.hpp"

namespace attn {
namespace {

constexpr double kU = 1.0 / 16777216.0;
constexpr double kExpErr = 1.05e-4;  // the bf16 path's exp2 (docs/conventions.md, "bf16 compute")

const detail::KernelSet* bf16_row() {
    if (!detail::cpu_features().has_avx512_bf16()) return nullptr;
    return detail::kernel_set_for(detail::Isa::avx512);
}

// The kind of bf16 products this process runs: AMX tiles where the CPU has AMX-BF16 (and
// ATTN_CPU_HIDE does not hide it), else vdpbf16ps.
detail::Compute expected_compute() {
    return detail::cpu_features().has_amx_bf16() ? detail::Compute::bf16_amx : detail::Compute::bf16_dot;
}

#define ATTN_NEED_BF16()                                                                   \
    const detail::KernelSet* row = bf16_row();                                             \
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";                  \
    ASSERT_NE(row->flash_forward_bf16, nullptr)

struct Case {
    Tensor q, k, v, kstore, bool_mask, add_mask, key_lengths, slopes, sinks;
    TensorView kview, vview;
    SdpaOptions opt;
    std::int64_t offset = 0;
    bool want_weights = false;
    std::string desc;
};

// Q (B, Hq, Lq, Dk), K (B, Hkv, Lk, Dk) and V (B, Hkv, Lk, Dv), contiguous bf16, drawn in that order.
Case contiguous_case(std::mt19937_64& rng, std::int64_t B, std::int64_t Hq, std::int64_t Hkv, std::int64_t Lq,
                     std::int64_t Lk, std::int64_t Dk, std::int64_t Dv) {
    Case c;
    c.q = test::to_storage(test::randn(DType::f32, Shape{B, Hq, Lq, Dk}, rng), DType::bf16);
    c.kstore = test::to_storage(test::randn(DType::f32, Shape{B, Hkv, Lk, Dk}, rng), DType::bf16);
    c.kview = c.kstore.view();
    c.v = test::to_storage(test::randn(DType::f32, Shape{B, Hkv, Lk, Dv}, rng), DType::bf16);
    c.vview = c.v.view();
    return c;
}

// long_keys: more than one 256-key block (the AMX default tiles, 128 × 256) and query blocks of
// 128 with a ragged last one.
Case random_case(std::mt19937_64& rng, bool long_keys = false) {
    auto pick = [&](std::initializer_list<std::int64_t> xs) {
        std::vector<std::int64_t> v(xs);
        return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
    };
    auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
    const std::int64_t B = pick({1, 2}), Hkv = pick({1, 2}), G = pick({1, 3}), Hq = Hkv * G;
    const std::int64_t Lq = long_keys ? pick({1, 129, 200}) : pick({1, 7, 33, 70, 130});
    const std::int64_t Lk = long_keys ? pick({257, 300, 513}) : pick({1, 8, 63, 100, 130});
    // Head dims off the AMX tiles' 32-element reduction step and 16-row tiles on purpose.
    const std::int64_t Dk = pick({1, 3, 8, 17, 33, 64, 80, 96, 130}), Dv = pick({1, 3, 8, 16, 33, 64, 80, 130});
    Case c;
    c.q = test::to_storage(test::randn(DType::f32, Shape{B, Hq, Lq, Dk}, rng), DType::bf16);
    const bool strided_v = chance(0.25);
    if (strided_v) {  // V's head dim strided (the bf16 V pairs' scalar path): stored (B, Hkv, Dv, Lk)
        c.v = test::to_storage(test::randn(DType::f32, Shape{B, Hkv, Dv, Lk}, rng), DType::bf16);
        c.vview = c.v.view().transpose(2, 3);
    } else {
        c.v = test::to_storage(test::randn(DType::f32, Shape{B, Hkv, Lk, Dv}, rng), DType::bf16);
        c.vview = c.v.view();
    }
    const bool strided_k = chance(0.25);
    if (strided_k) {  // K's head dim strided: stored (B, Hkv, Dk, Lk), viewed transposed
        c.kstore = test::to_storage(test::randn(DType::f32, Shape{B, Hkv, Dk, Lk}, rng), DType::bf16);
        c.kview = c.kstore.view().transpose(2, 3);
    } else {
        c.kstore = test::to_storage(test::randn(DType::f32, Shape{B, Hkv, Lk, Dk}, rng), DType::bf16);
        c.kview = c.kstore.view();
    }
    SdpaOptions& o = c.opt;
    const int kind = static_cast<int>(pick({0, 1, 2, 3, 4, 5, 6, 7}));
    c.desc = "B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
             " Lq=" + std::to_string(Lq) + " Lk=" + std::to_string(Lk) + " Dk=" + std::to_string(Dk) +
             " Dv=" + std::to_string(Dv) + " mask=" + std::to_string(kind) + (strided_k ? " strided-K" : "") + (strided_v ? " strided-V" : "");
    switch (kind) {
        case 0: break;
        case 1: o.causal = Causal::top_left; break;
        case 2: o.causal = Causal::bottom_right; break;
        case 3: o.window = Window{pick({0, 3, 20}), pick({-1, 0, 5}), Align::bottom_right}; break;
        case 4:
            c.key_lengths = Tensor(DType::i64, Shape{B});
            for (std::int64_t b = 0; b < B; ++b)
                c.key_lengths.data_as<std::int64_t>()[b] = std::uniform_int_distribution<std::int64_t>(0, Lk)(rng);
            o.key_lengths = c.key_lengths;
            o.causal = Causal::bottom_right;
            break;
        case 5:
            c.bool_mask = test::random_bool(Shape{B, 1, Lq, Lk}, rng, 0.7);
            o.bool_mask = c.bool_mask;
            break;
        case 6:
            c.add_mask = test::randn(DType::f32, Shape{1, Hq, Lq, Lk}, rng, 2.0);
            o.additive_mask = c.add_mask;
            break;
        case 7:
            c.offset = pick({-3, 0, 40});
            o.query_offset = QueryOffset(c.offset);
            o.causal = Causal::top_left;
            o.window = Window{10, -1, Align::top_left};
            break;
    }
    if (chance(0.3)) {
        o.softcap = static_cast<double>(pick({1, 5, 30}));
        c.desc += " softcap=" + std::to_string(o.softcap);
    }
    if (chance(0.3)) {
        c.slopes = test::rand_uniform(DType::f32, Shape{B, Hq}, rng, 0.0, 0.5);
        o.alibi_slopes = c.slopes;
        c.desc += " alibi";
    }
    if (chance(0.3)) {
        c.sinks = test::randn(DType::f32, Shape{Hq}, rng, 2.0);
        o.sinks = c.sinks;
        c.desc += " sinks";
    }
    if (chance(0.2)) {
        o.dropout_p = 0.2;
        o.dropout_seed = 1234 + static_cast<std::uint64_t>(Lq);
        c.desc += " dropout";
    }
    c.want_weights = chance(0.5);
    if (c.want_weights) c.desc += " weights";
    return c;
}

struct Out {
    Tensor out, lse, weights;
};

// The double reference on the same bf16 inputs.
Out reference(const Case& c) {
    const std::int64_t B = c.q.view().dim(0), Hq = c.q.view().dim(1), Lq = c.q.view().dim(2), Lk = c.kview.dim(2), Dv = c.vview.dim(3);
    Out r{test::poisoned(DType::f64, Shape{B, Hq, Lq, Dv}), test::poisoned(DType::f64, Shape{B, Hq, Lq}),
          test::poisoned(DType::f64, Shape{B, Hq, Lq, Lk})};
    SdpaOptions o = c.opt;
    o.impl = Impl::reference;
    TensorView l = r.lse, w = r.weights;
    sdpa(c.q, c.kview, c.vview, o, r.out, &l, &w);
    return r;
}

// The bf16-compute flash forward (the avx512 row, which must pick bf16 compute here).
Out run_flash(const Case& c, const detail::KernelSet& row, int threads, const detail::FlashTiles* tiles = nullptr) {
    const std::int64_t B = c.q.view().dim(0), Hq = c.q.view().dim(1), Lq = c.q.view().dim(2), Lk = c.kview.dim(2), Dv = c.vview.dim(3);
    Out r{test::poisoned(DType::f32, Shape{B, Hq, Lq, Dv}), test::poisoned(DType::f32, Shape{B, Hq, Lq}),
          test::poisoned(DType::f32, Shape{B, Hq, Lq, Lk})};
    const TensorView l = r.lse, w = r.weights;
    detail::SdpaProblem p = detail::make_problem(c.q, c.kview, c.vview, c.opt, r.out, &l, c.want_weights ? &w : nullptr);
    p.bf16_products = true;  // a float32 out, so that P's rounding is measured alone
    EXPECT_EQ(detail::flash_compute(row, p), expected_compute()) << c.desc;
    detail::flash_forward(p, row, threads, tiles);
    return r;
}

using test::max_abs;

// The header's bound, checked element by element; returns the worst error/bound ratio.
double check(const Case& c, const Out& got, const Out& ref) {
    const TensorView q = c.q, k = c.kview, v = c.vview;
    const std::int64_t B = q.dim(0), Hq = q.dim(1), Lq = q.dim(2), Dk = q.dim(3), Lk = k.dim(2), Dv = v.dim(3);
    const std::int64_t G = Hq / k.dim(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(Dk));
    double qk = 0;  // max_ij Σ_d |q k|
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < Lq; ++i)
                for (std::int64_t j = 0; j < Lk; ++j) {
                    double s = 0;
                    for (std::int64_t d = 0; d < Dk; ++d)
                        s += std::fabs(test::at(q, b, h, i, d) * test::at(k, b, h / G, j, d));
                    if (std::isfinite(s)) qk = std::max(qk, s);  // a non-finite score: the contract (below), not a bound
                }
    const double slope = !c.slopes.view().empty() ? max_abs(c.slopes) : 0.0;
    const double dist = static_cast<double>(Lq + Lk + 64 + std::llabs(c.offset));  // as test_modifiers.cpp
    const double mask = !c.add_mask.view().empty() ? max_abs(c.add_mask) : 0.0;
    const double sink = !c.sinks.view().empty() ? max_abs(c.sinks) : 0.0;
    const double S = scale * qk + slope * dist;
    const double E = (Dk + 2) * kU * scale * qk + (c.opt.softcap > 0 ? c.opt.softcap * (1.5e-7 + 4 * kU) : 0.0) +
                     4 * kU * slope * dist + 8 * kU * (S + mask + sink);
    // The finite lse only: a row with no visible key (−inf) must not make every row's bound infinite.
    double lsemax = 0;
    for (std::int64_t x = 0; x < ref.lse.numel(); ++x)
        if (const double l = test::load(ref.lse, x); std::isfinite(l)) lsemax = std::max(lsemax, std::fabs(l));
    const double vmax = max_abs(v);
    const double n = static_cast<double>(Lk);
    double worst = 0;
    auto track = [&](double err, double bound, const std::string& what) {
        const double ratio = err / bound;
        if (!(ratio <= 1.0)) ADD_FAILURE() << c.desc << ": " << what << " error " << err << " > bound " << bound;
        worst = std::max(worst, std::isnan(ratio) ? 1e9 : ratio);
    };
    // The weights that multiplied V, for the P-rounding term: the reference's (returned).
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < Lq; ++i) {
                const std::string at = "(" + std::to_string(b) + "," + std::to_string(h) + "," + std::to_string(i);
                const double rl = test::at(ref.lse, b, h, i), gl = test::at(got.lse, b, h, i);
                if (std::isnan(rl)) {  // a visible NaN or +inf score: out and lse NaN (conventions, "Non-finite values")
                    EXPECT_TRUE(test::written_nan(gl)) << c.desc << " lse" << at << ") = " << gl;
                    for (std::int64_t d = 0; d < Dv; ++d)
                        EXPECT_TRUE(test::written_nan(test::at(got.out, b, h, i, d))) << c.desc << " out" << at << "," << d << ")";
                    continue;
                }
                if (std::isinf(rl)) {
                    EXPECT_EQ(gl, rl) << c.desc << " lse" << at;
                } else {
                    track(std::fabs(gl - rl), E + (n + 16) * kU + kU * lsemax + kExpErr, "lse" + at + ")");
                }
                for (std::int64_t d = 0; d < Dv; ++d) {
                    double a = 0;
                    for (std::int64_t j = 0; j < Lk; ++j)
                        a += std::fabs(test::at(ref.weights, b, h, i, j) * test::at(v, b, h / G, j, d));
                    const double bound =
                        (std::ldexp(1.0, -8) + 2 * kExpErr) * (1 + std::ldexp(1.0, -7)) * a + (2 * E + (n + 16) * kU) * vmax +
                        n * std::ldexp(1.0, -125) * vmax;
                    const double err = std::fabs(test::at(got.out, b, h, i, d) - test::at(ref.out, b, h, i, d));
                    if (std::isinf(rl)) {
                        EXPECT_EQ(test::at(got.out, b, h, i, d), 0.0) << c.desc << " out" << at << "," << d << ")";
                    } else {
                        track(err, bound, "out" + at + "," + std::to_string(d) + ")");
                    }
                }
                if (!c.want_weights) continue;
                for (std::int64_t j = 0; j < Lk; ++j) {
                    const double w = test::at(ref.weights, b, h, i, j), g = test::at(got.weights, b, h, i, j);
                    track(std::fabs(g - w), w * (2 * E + (n + 16) * kU + kExpErr) + std::ldexp(1.0, -125),
                          "weights" + at + "," + std::to_string(j) + ")");
                }
            }
    return worst;
}

using test::bit_equal;

// O and lse, bit for bit.
bool same_bits(const Out& a, const Out& b) { return bit_equal(a.out, b.out) && bit_equal(a.lse, b.lse); }

// The call on 1 thread checked against ref (worst: the largest error/bound ratio so far), and on
// 2 threads bit for bit the same; returns the 1-thread result.
Out one_and_two_threads(const Case& c, const detail::KernelSet& row, const Out& ref, double& worst,
                        const detail::FlashTiles* tiles = nullptr) {
    Out one = run_flash(c, row, 1, tiles);
    worst = std::max(worst, check(c, one, ref));
    EXPECT_TRUE(same_bits(one, run_flash(c, row, 2, tiles))) << c.desc << ": 1 vs 2 threads";
    return one;
}

TEST(Bf16Compute, RandomCasesMatchReference) {
    ATTN_NEED_BF16();
    std::mt19937_64 rng(20261201);
    double worst = 0;
    for (int n = 0; n < 60; ++n) {
        const Case c = random_case(rng);
        const Out ref = reference(c);
        one_and_two_threads(c, *row, ref, worst);
        const detail::FlashTiles split{64, 16, 3};  // each task's keys in 3 chunks, merged
        worst = std::max(worst, check(c, run_flash(c, *row, 2, &split), ref));
        const detail::FlashTiles ragged{64, 40};  // key blocks of 40: a partial 16-key tile in each
        worst = std::max(worst, check(c, run_flash(c, *row, 1, &ragged), ref));
        const detail::FlashTiles grouped{32, 16, 0, 3};  // query blocks of 32 in groups of 3: the same bits
        const detail::FlashTiles alone{32, 16, 0, 1};
        const Out g = run_flash(c, *row, 2, &grouped), a = run_flash(c, *row, 2, &alone);
        EXPECT_TRUE(same_bits(g, a)) << c.desc << ": grouped vs one task at a time";
        if (HasFailure()) break;
    }
    std::printf("worst error / bound over the cases: %.3g\n", worst);
}

// Without a mask or modifier both bf16 paths take each column's max from their Sᵀ product's store
// (qk_amx on AMX, qk_bf16_raw's 8-key tiles on vdpbf16ps) instead of a pass over Sᵀ. One score per query far above the rest — Q[i] = 32·K[j(i)],
// so S[i][j(i)] ≈ 4·|k|² ≈ 256 against others within ≈ 120 — overflows the weights to inf (O
// and lse not finite) wherever that max misses a key: j(i) lands in every 16-key tile position,
// both 16-query halves of a panel, the last (partial) tile of a block and blocks of 40 keys.
TEST(Bf16Compute, ColumnMaxSeesEveryKey) {
    ATTN_NEED_BF16();
    std::mt19937_64 rng(77);
    const std::int64_t Lq = 70, Lk = 203, D = 64;  // one block of 203 keys, and 5 × 40 + 3: odd tails
    Case c;
    const Tensor k = test::randn(DType::f32, Shape{1, 1, Lk, D}, rng);
    Tensor q(DType::f32, Shape{1, 1, Lq, D});
    for (std::int64_t i = 0; i < Lq; ++i) {
        const std::int64_t j = i + 1 < Lq ? (i * 37 + 5) % Lk : Lk - 1;  // the last key: a tail's odd row
        for (std::int64_t d = 0; d < D; ++d)  // 32·bf16(k) is a bf16: the spike is exact
            q.data_as<float>()[i * D + d] = 32.0f * bf16_to_float(float_to_bf16(k.data_as<float>()[j * D + d]));
    }
    c.q = test::to_storage(q, DType::bf16);
    c.kstore = test::to_storage(k, DType::bf16);
    c.kview = c.kstore.view();
    c.v = test::to_storage(test::randn(DType::f32, Shape{1, 1, Lk, D}, rng), DType::bf16);
    c.vview = c.v.view();
    c.desc = "one large score per query";
    const Out ref = reference(c);
    const detail::FlashTiles ragged{64, 40};
    double worst = std::max(check(c, run_flash(c, *row, 1), ref), check(c, run_flash(c, *row, 2, &ragged), ref));
    std::printf("worst error / bound: %.3g\n", worst);
}

// The AMX path keeps one head's Vᵀ per thread across tasks (AmxBf16Ops::head_units): a key
// block covering whole 32-key units reads it, any other block makes its own. Many tasks and key
// blocks a head (32-query, 64-key tiles), two batches × two KV heads (the copy changes hands),
// GQA, Lk off the 32-key units, causal and key-length masks, groups of tasks sharing the copy:
// the bound against the reference, and the bits of 1 vs 2 threads and of grouped vs alone.
// Then V NaN past each batch's key length: O's bits must not change (no unit across a block's
// end may reach it — though on the Sapphire Rapids VM tdpbf16ps gave 0, not NaN, for 0·NaN and
// 0·inf, so there only a wrong unit's visible values would show); and a call on V changed in
// place (a copy must not outlive its call — the workspace zeroes it each call; without that
// zeroing this test still passed here, the allocator not handing back an old copy with a
// matching header). Where the CPU lacks AMX the same cases run on vdpbf16ps.
TEST(Bf16Compute, HeadVtCopyAcrossTasks) {
    ATTN_NEED_BF16();
    std::mt19937_64 rng(20261206);
    const detail::FlashTiles small{32, 64}, grouped{32, 64, 0, 3}, alone{32, 64, 0, 1}, ragged{32, 40};
    struct Shape4 {
        std::int64_t G, Lq, Lk, D;
        int mask;  // 0 none, 1 causal top-left, 2 key lengths
    };
    const Shape4 shapes[] = {{1, 100, 200, 64, 0}, {2, 130, 256, 64, 1}, {1, 70, 77, 33, 2},
                             {2, 100, 200, 128, 2}, {1, 130, 160, 80, 1}, {2, 64, 300, 16, 0}};
    double worst = 0;
    for (const Shape4& s : shapes) {
        const std::int64_t B = 2, Hkv = 2, Hq = Hkv * s.G;
        Case c = contiguous_case(rng, B, Hq, Hkv, s.Lq, s.Lk, s.D, s.D);
        if (s.mask == 1) c.opt.causal = Causal::top_left;
        if (s.mask == 2) {
            c.key_lengths = Tensor(DType::i64, Shape{B});
            c.key_lengths.data_as<std::int64_t>()[0] = s.Lk / 2 + 1;
            c.key_lengths.data_as<std::int64_t>()[1] = 64;  // ends on a unit: the copy serves its last block
            c.opt.key_lengths = c.key_lengths;
        }
        c.desc = "G=" + std::to_string(s.G) + " Lq=" + std::to_string(s.Lq) + " Lk=" + std::to_string(s.Lk) +
                 " D=" + std::to_string(s.D) + " mask=" + std::to_string(s.mask);
        const Out ref = reference(c);
        const Out one = one_and_two_threads(c, *row, ref, worst, &small);
        worst = std::max(worst, check(c, run_flash(c, *row, 1, &ragged), ref));
        const Out g = run_flash(c, *row, 2, &grouped), a = run_flash(c, *row, 2, &alone);
        EXPECT_TRUE(same_bits(g, a)) << c.desc << ": grouped vs one task at a time";
        if (s.mask == 2) {  // V NaN past each key length (in place): never seen, must not reach O
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t h = 0; h < Hkv; ++h)
                    for (std::int64_t j = c.key_lengths.data_as<std::int64_t>()[b]; j < s.Lk; ++j)
                        for (std::int64_t d = 0; d < s.D; ++d) test::store(c.v, c.v.view().offset(b, h, j, d), std::nan(""));
            const Out got = run_flash(c, *row, 2, &small);
            EXPECT_TRUE(bit_equal(got.out, one.out)) << c.desc << ": NaN V past the key lengths changed O";
        }
        // The same tensors again with V changed in place (all finite): the result of the new V.
        const Tensor v2 = test::to_storage(test::randn(DType::f32, Shape{B, Hkv, s.Lk, s.D}, rng), DType::bf16);
        std::memcpy(c.v.data(), v2.data(), static_cast<std::size_t>(v2.view().numel()) * 2);
        worst = std::max(worst, check(c, run_flash(c, *row, 1, &small), reference(c)));
        if (HasFailure()) break;
    }
    std::printf("worst error / bound: %.3g\n", worst);
}

// More than one key block at the default tiles (AMX: 128 queries × 256 keys, so Lk = 257 leaves a
// block of one key, 300 one of 44, 513 three blocks), every mask kind and modifier: the running
// max and α carried from block to block, with the column max from qk_amx where nothing changed
// Sᵀ. 1 and 2 threads bit-identical.
TEST(Bf16Compute, DefaultTilesOverSeveralKeyBlocks) {
    ATTN_NEED_BF16();
    std::mt19937_64 rng(20261206);
    double worst = 0;
    for (int n = 0; n < 16; ++n) {
        const Case c = random_case(rng, true);
        const Out ref = reference(c);
        one_and_two_threads(c, *row, ref, worst);
        if (HasFailure()) break;
    }
    std::printf("worst error / bound over the cases: %.3g\n", worst);
}

// Whole key blocks masked for some rows: a bool mask hides keys 0..255 (the first block at the AMX
// default tiles) from every third row, all keys from every seventh, and a random 30 % elsewhere;
// so a row's first block leaves m = −inf and l = 0 for the next to start from, beside rows that
// saw it. Against the reference, and the same with blocks of 40 keys.
TEST(Bf16Compute, MaskedKeyBlocks) {
    ATTN_NEED_BF16();
    std::mt19937_64 rng(31);
    const std::int64_t Lq = 130, Lk = 300, D = 64, Dv = 40;
    Case c = contiguous_case(rng, 1, 2, 2, Lq, Lk, D, Dv);
    c.bool_mask = test::random_bool(Shape{1, 1, Lq, Lk}, rng, 0.7);
    std::uint8_t* m = c.bool_mask.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < Lq; ++i)
        for (std::int64_t j = 0; j < Lk; ++j) {
            if (i % 7 == 0 || (i % 3 == 0 && j < 256)) m[i * Lk + j] = 0;
        }
    c.opt.bool_mask = c.bool_mask;
    c.desc = "masked key blocks";
    const Out ref = reference(c);
    const detail::FlashTiles ragged{64, 40};
    const double worst = std::max(check(c, run_flash(c, *row, 2), ref), check(c, run_flash(c, *row, 1, &ragged), ref));
    std::printf("worst error / bound: %.3g\n", worst);
}

// Non-finite Q and K (docs/conventions.md, "Non-finite values"): a visible NaN or +inf score makes
// the row's out and lse NaN, a −inf score is a zero weight (a row of only those sees no key: out
// 0, lse −inf), and a masked key changes nothing whatever it holds. Dimension 0 of Q and K is
// positive, so an infinity there gives scores of one sign. Without a mask the AMX path takes each
// column's max from qk_amx's store, with one (causal, key lengths) from its own pass over Sᵀ:
// both, over 300 keys (two blocks at the default tiles, so a NaN or infinite max meets the next
// block's α) and over blocks of 40; a whole first block of −inf scores too.
TEST(Bf16Compute, NonFiniteScores) {
    ATTN_NEED_BF16();
    const std::int64_t Lq = 70, Lk = 300, D = 40, Dv = 33;
    std::mt19937_64 rng(2027);
    int nan_rows = 0, empty_rows = 0, finite_rows = 0;
    for (int mask = 0; mask < 3; ++mask)
        for (int poison = 0; poison < 7; ++poison) {
            Tensor q = test::randn(DType::f32, Shape{1, 2, Lq, D}, rng);
            Tensor k = test::randn(DType::f32, Shape{1, 1, Lk, D}, rng);
            for (std::int64_t x = 0; x < 2 * Lq; ++x) q.data_as<float>()[x * D] = std::fabs(q.data_as<float>()[x * D]) + 0.25f;
            for (std::int64_t j = 0; j < Lk; ++j) k.data_as<float>()[j * D] = std::fabs(k.data_as<float>()[j * D]) + 0.25f;
            const std::int64_t j = std::vector<std::int64_t>{0, 15, 16, 63, 255, 256, Lk - 1}[static_cast<std::size_t>(poison)];
            const std::int64_t i = (7 * poison + 3) % Lq, d = 1 + poison % (D - 1);
            std::string what;
            switch (poison) {
                case 0: k.data_as<float>()[j * D] = -INFINITY, what = "K[j][0] = -inf"; break;
                case 1: k.data_as<float>()[j * D + d] = NAN, what = "K[j][d] = NaN"; break;
                case 2: k.data_as<float>()[j * D] = INFINITY, what = "K[j][0] = +inf"; break;
                case 3: q.data_as<float>()[i * D] = -INFINITY, what = "Q[i][0] = -inf"; break;
                case 4: q.data_as<float>()[(Lq + i) * D + d] = NAN, what = "Q[i][d] = NaN (head 1)"; break;
                case 5: q.data_as<float>()[i * D] = INFINITY, what = "Q[i][0] = +inf"; break;
                default:
                    for (std::int64_t x = 0; x < 256; ++x) k.data_as<float>()[x * D] = -INFINITY;
                    what = "K[0..255][0] = -inf";
            }
            Case c;
            c.q = test::to_storage(q, DType::bf16);
            c.kstore = test::to_storage(k, DType::bf16);
            c.kview = c.kstore.view();
            c.v = test::to_storage(test::randn(DType::f32, Shape{1, 1, Lk, Dv}, rng), DType::bf16);
            c.vview = c.v.view();
            if (mask == 1) c.opt.causal = Causal::top_left;  // query i sees keys 0..i: a poison at j > i is masked
            if (mask == 2) {
                c.key_lengths = Tensor(DType::i64, Shape{1});
                c.key_lengths.data_as<std::int64_t>()[0] = 260;  // keys 260.. masked for every row
                c.opt.key_lengths = c.key_lengths;
            }
            c.desc = what + " j=" + std::to_string(j) + " i=" + std::to_string(i) + " mask=" + std::to_string(mask);
            const Out ref = reference(c);
            for (std::int64_t x = 0; x < ref.lse.numel(); ++x) {
                const double l = test::load(ref.lse, x);
                (std::isnan(l) ? nan_rows : std::isinf(l) ? empty_rows : finite_rows) += 1;
            }
            const detail::FlashTiles ragged{64, 40};
            check(c, run_flash(c, *row, 1), ref);
            check(c, run_flash(c, *row, 2, &ragged), ref);
            if (HasFailure()) return;
        }
    // Each outcome of the contract was met (the poison is where the comments say).
    EXPECT_GT(nan_rows, 0);
    EXPECT_GT(empty_rows, 0);
    EXPECT_GT(finite_rows, 0);
    std::printf("rows: %d NaN, %d with no visible key, %d finite\n", nan_rows, empty_rows, finite_rows);
}

// An all-bfloat16 sdpa call reports the AMX kernel where the CPU has AMX-BF16.
TEST(Bf16Compute, AmxKernelWhereTheCpuHasIt) {
    ATTN_NEED_BF16();
    if (!detail::cpu_features().has_amx_bf16()) GTEST_SKIP() << "skipped: CPU lacks amx_bf16";
    std::mt19937_64 rng(14);
    const Tensor q = test::to_storage(test::randn(DType::f32, Shape{1, 2, 40, 64}, rng), DType::bf16);
    const Tensor k = test::to_storage(test::randn(DType::f32, Shape{1, 2, 50, 64}, rng), DType::bf16);
    const Tensor v = test::to_storage(test::randn(DType::f32, Shape{1, 2, 50, 64}, rng), DType::bf16);
    Tensor out = test::poisoned(DType::bf16, Shape{1, 2, 40, 64});
    SdpaReport report;
    const detail::ScopedKernelSet on_avx512(*row);  // the avx512 row even under ATTN_ISA=avx2
    sdpa(q, k, v, SdpaOptions{}, out, nullptr, nullptr, &report);
    EXPECT_EQ(report.kernel, "flash/avx512_amx_bf16");
}

// The P rounding is there (a kernel that silently ran the float32 products would pass the
// test above too): three keys with scores m, 0, 0 and V = 0, 1, 1. The softmax subtracts
// the max m, so P = 1, e^-m, e^-m and O = 2·e^-m / (1 + 2e^-m) — with e^-m from the path's
// exp2 (exp2_bf16 of the kernel's float argument −m·log2 e) rounded to bf16 in the numerator
// only (l sums the float32 P).
TEST(Bf16Compute, RoundsPToBf16) {
    ATTN_NEED_BF16();
    const std::int64_t Lq = 64, Lk = 3, D = 8;
    Tensor q = test::poisoned(DType::bf16, Shape{1, 1, Lq, D}), k = test::poisoned(DType::bf16, Shape{1, 1, Lk, D});
    Tensor v = test::poisoned(DType::bf16, Shape{1, 1, Lk, D});
    for (std::int64_t i = 0; i < q.numel(); ++i) test::store(q, i, 0.0);  // every product 0
    for (std::int64_t i = 0; i < k.numel(); ++i) test::store(k, i, 1.0);
    for (std::int64_t j = 0; j < Lk; ++j)
        for (std::int64_t d = 0; d < D; ++d) test::store(v, j * D + d, j == 0 ? 0.0 : 1.0);
    Tensor mask(DType::f32, Shape{1, 1, Lq, Lk});  // key 0's score m_i = 0.05·i (a float)
    for (std::int64_t i = 0; i < Lq; ++i)
        for (std::int64_t j = 0; j < Lk; ++j) mask.data_as<float>()[i * Lk + j] = j == 0 ? 0.05f * static_cast<float>(i) : 0.0f;
    SdpaOptions o;
    o.additive_mask = mask;
    Tensor out = test::poisoned(DType::f32, Shape{1, 1, Lq, D});
    detail::SdpaProblem p = detail::make_problem(q, k, v, o, out, nullptr, nullptr);
    p.bf16_products = true;  // a float32 out, so that P's rounding is measured alone
    ASSERT_EQ(detail::flash_compute(*row, p), expected_compute());
    detail::flash_forward(p, *row, 1, nullptr);
    double worst_rel = 0;
    int off_model = 0;
    for (std::int64_t i = 1; i < Lq; ++i) {
        const float m = mask.data_as<float>()[i * Lk];
        const double e = std::exp(-static_cast<double>(m));
        const double want = 2 * e / (1 + 2 * e);
        const float x = (0.0f - m) * 1.4426950408889634f;  // the kernel's argument, in float
        float ek = 0.0f;
        detail::flash_bf16_avx512_ns::exp2_bf16(&x, &ek, 1);
        const double eb = static_cast<double>(bf16_to_float(float_to_bf16(ek)));
        const double got = test::at(out, 0, 0, i, 0);
        // The model 2·bf16(e')/(1 + 2e') with the kernel's e'; count rows off it (a different
        // summation order of l could move the last bit) instead of failing on one.
        if (std::fabs(got - 2 * eb / (1 + 2 * static_cast<double>(ek))) > 1e-6) ++off_model;
        worst_rel = std::max(worst_rel, std::fabs(got - want) / want);
    }
    EXPECT_LE(off_model, 2) << "rows whose O is not 2·bf16(e^-m)/(1 + 2e^-m)";
    EXPECT_GT(worst_rel, 1e-4) << "P was not rounded to bf16: is this the float32 path?";
    EXPECT_LE(worst_rel, (std::ldexp(1.0, -8) + 2 * kExpErr) * 1.01);
}

// The bf16 path's exp2 (bf16_dot.hpp, exp2_bf16): relative error ≤ kExpErr against the double
// 2^x on a dense sweep of [−126, 8] (the softmax's arguments: (score − m)·log2 e ≤ 8, m the lazy
// running max), the special values, and more than the degree-4 polynomial's 2.8e-6 — the
// degree-3 one the bound was derived for (a degree-2 one, 1.96e-3, fails the bound).
TEST(Bf16Compute, Exp2Bf16WithinBound) {
    ATTN_NEED_BF16();
    const int n = 1 << 21;
    std::vector<float> x(n), y(n, std::nanf(""));
    for (int i = 0; i < n; ++i) x[i] = static_cast<float>(8.0 - 134.0 * i / (n - 1));
    detail::flash_bf16_avx512_ns::exp2_bf16(x.data(), y.data(), n);
    double worst = 0;
    for (int i = 0; i < n; ++i) {
        const double want = std::exp2(static_cast<double>(x[i]));
        const double rel = std::fabs(static_cast<double>(y[i]) - want) / want;
        if (!(rel <= kExpErr)) {
            ADD_FAILURE() << "exp2_bf16(" << x[i] << ") = " << y[i] << ", want " << want;
            break;
        }
        worst = std::max(worst, rel);
    }
    std::printf("exp2_bf16: worst relative error %.3g (bound %.3g)\n", worst, kExpErr);
    EXPECT_GT(worst, 1e-5) << "not the degree-3 polynomial the bound was derived for";
    const float ints[] = {1.0f, 8.0f, -3.0f};  // p(0) = 1: 2^n exactly at integers, positive ones too (the lazy max)
    float got[3];
    detail::flash_bf16_avx512_ns::exp2_bf16(ints, got, 3);
    EXPECT_EQ(got[0], 2.0f);
    EXPECT_EQ(got[1], 256.0f);
    EXPECT_EQ(got[2], 0.125f);
    const float special[] = {0.0f, -0.0f, -126.5f, -127.0f, -1000.0f, -INFINITY, std::nanf("")};
    float out[7];
    detail::flash_bf16_avx512_ns::exp2_bf16(special, out, 7);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], 1.0f);
    for (int i = 2; i < 6; ++i) EXPECT_EQ(out[i], 0.0f) << special[i];
    EXPECT_TRUE(std::isnan(out[6]));
}

// The lazy rescale (flash_avx512_bf16.cpp, lazy_max): a second key block whose max passes the
// running max by at most 8·ln 2 leaves m as it was and α exactly 1 — its weights then reach
// 2^8, not 1 — and one that passes it by more moves m to the new max (α < 1). Either way the
// normalised weights over both blocks (block 1's P·α and block 2's P, over l) are the double
// softmax of the same scores within the exp's error in P and in l, and l ≥ 1.
TEST(Bf16Compute, LazyRescaleMovesTheMaxOnlyPast8Bits) {
    ATTN_NEED_BF16();
    const int nk = 24, ncols = 32, ld = 32;
    const double slack = 8 * std::log(2.0);
    std::mt19937_64 rng(23);
    std::uniform_real_distribution<float> below(-3.0f, 0.0f);
    alignas(64) float s1[nk * ld], s2[nk * ld], m[ncols], l[ncols], a[ncols];
    std::vector<float> d(ncols), sc1(nk * ld), sc2(nk * ld);
    for (int q = 0; q < ncols; ++q)  // block 2's max over block 1's (0): below the slack, then past it
        d[q] = static_cast<float>(q < 16 ? slack * q / 16.0 : slack * (1.0 + (q - 15) / 16.0));
    d[15] = static_cast<float>(slack) * (1 - 0x1p-20f);  // just below
    for (int j = 0; j < nk; ++j)
        for (int q = 0; q < ncols; ++q) {
            s1[j * ld + q] = j == 2 ? 0.0f : below(rng);
            s2[j * ld + q] = j == 5 ? d[q] : below(rng) + d[q] - 3.0f;
        }
    std::memcpy(sc1.data(), s1, sizeof s1);
    std::memcpy(sc2.data(), s2, sizeof s2);
    for (int q = 0; q < ncols; ++q) m[q] = -INFINITY, l[q] = 0.0f;
    detail::flash_bf16_avx512_ns::softmax_bf16(s1, ld, nk, ncols, m, l, a, nullptr, ld, true);  // s1 ← P
    for (int q = 0; q < ncols; ++q) ASSERT_EQ(m[q], 0.0f) << "block 1 sets m to its max, column " << q;
    detail::flash_bf16_avx512_ns::softmax_bf16(s2, ld, nk, ncols, m, l, a, nullptr, ld, true);  // s2 ← P
    for (int q = 0; q < ncols; ++q) {
        double pmax = 0;
        for (int j = 0; j < nk; ++j) pmax = std::max(pmax, static_cast<double>(s2[j * ld + q]));
        if (q < 16) {
            EXPECT_EQ(m[q], 0.0f) << "m moved by " << d[q] << " ≤ 8·ln 2, column " << q;
            EXPECT_EQ(a[q], 1.0f) << "column " << q;
            EXPECT_NEAR(pmax, std::exp(static_cast<double>(d[q])), std::exp(static_cast<double>(d[q])) * kExpErr) << q;
        } else {
            EXPECT_EQ(m[q], d[q]) << "m stayed although the max moved by " << d[q] << ", column " << q;
            EXPECT_LT(a[q], 1.0f / 256) << "column " << q;
            EXPECT_EQ(pmax, 1.0) << "column " << q;
        }
        EXPECT_GE(l[q], 1.0f) << "column " << q;
        // The double softmax over both blocks against P·α / l (block 1) and P / l (block 2).
        double top = 0, sum = 0;
        for (int j = 0; j < nk; ++j) top = std::max({top, static_cast<double>(sc1[j * ld + q]), static_cast<double>(sc2[j * ld + q])});
        for (int j = 0; j < nk; ++j) sum += std::exp(sc1[j * ld + q] - top) + std::exp(sc2[j * ld + q] - top);
        const double tol = 2 * kExpErr + 64 * kU;
        for (int j = 0; j < nk; ++j) {
            const double w1 = std::exp(sc1[j * ld + q] - top) / sum, w2 = std::exp(sc2[j * ld + q] - top) / sum;
            EXPECT_NEAR(static_cast<double>(s1[j * ld + q]) * a[q] / l[q], w1, w1 * tol) << "block 1, key " << j << ", column " << q;
            EXPECT_NEAR(static_cast<double>(s2[j * ld + q]) / l[q], w2, w2 * tol) << "block 2, key " << j << ", column " << q;
        }
    }
}

// The AMX path's unscaled Sᵀ (bf16_dot.hpp, softmax_bf16's raw_scale): the softmax on the raw
// products K·Qᵀ with the scale c folded into its exponent against the same softmax on the scores
// fl(c·s) as qk stores them. m and α must be bit-equal (the max scaled once is the max of the
// scaled), the weights and l equal to the exponent's extra roundings: x's error ≤ 4u·(|c·s| +
// |max|)·log2 e, so a relative difference ≤ ln 2 · that + 2^-22. Columns: random scores, the
// non-finite ones (+inf, NaN, −inf: the same classes as the scaled path); and columns whose
// max passes 2^8 — scores up to 10^4, a scale of 10^9 on unit products, and scores past
// 2^127 / log2 e (c = 1), where max·log2 e overflows — take the scaled path's form: bit-equal.
TEST(Bf16Compute, UnscaledScoresSoftmaxMatchesScaled) {
    ATTN_NEED_BF16();
    const int nk = 37, ncols = 32, ld = 32;
    std::mt19937_64 rng(20);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    auto run = [&](const std::vector<float>& raw, float c, const char* what) {
        alignas(64) float sraw[nk * ld], sc[nk * ld], cmraw[ncols], cmsc[ncols];
        alignas(64) float m0[ncols], l0[ncols], a0[ncols], m1[ncols], l1[ncols], a1[ncols];
        alignas(64) std::uint32_t p0[(nk + 1) / 2 * ld], p1[(nk + 1) / 2 * ld];
        for (int i = 0; i < nk * ld; ++i) sraw[i] = raw[static_cast<std::size_t>(i)], sc[i] = c * raw[static_cast<std::size_t>(i)];
        for (int q = 0; q < ncols; ++q) {
            cmraw[q] = cmsc[q] = -INFINITY;
            for (int j = 0; j < nk; ++j) {  // max, NaN-ignoring as vmaxps with the running max first
                cmraw[q] = sraw[j * ld + q] > cmraw[q] ? sraw[j * ld + q] : cmraw[q];
                cmsc[q] = sc[j * ld + q] > cmsc[q] ? sc[j * ld + q] : cmsc[q];
            }
            m0[q] = m1[q] = q % 3 == 0 ? -INFINITY : 0.5f * c * cmraw[q];  // a first block and later ones
            l0[q] = l1[q] = q % 3 == 0 ? 0.0f : 2.0f;
        }
        detail::flash_bf16_avx512_ns::softmax_bf16(sc, ld, nk, ncols, m0, l0, a0, p0, ld, true, cmsc);
        detail::flash_bf16_avx512_ns::softmax_bf16(sraw, ld, nk, ncols, m1, l1, a1, p1, ld, true, cmraw, c);
        auto near = [&](float got, float want, double mag, bool exact) {
            if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
            if (got == want) return true;  // the zeros and infinities too
            if (exact) return false;
            const double tol = std::log(2.0) * 4 * 0x1p-24 * mag * 1.4426950408889634 + 0x1p-22;
            return std::fabs(static_cast<double>(got) - want) <= tol * std::fabs(static_cast<double>(want));
        };
        for (int q = 0; q < ncols; ++q) {
            EXPECT_EQ(std::memcmp(&m0[q], &m1[q], 4), 0) << what << " m, column " << q << ": " << m0[q] << " " << m1[q];
            EXPECT_EQ(std::memcmp(&a0[q], &a1[q], 4), 0) << what << " alpha, column " << q;
            const double mx = std::fabs(static_cast<double>(m0[q]));
            const bool exact = std::isfinite(mx) && mx > 0x1p8;  // the scaled path's form
            double big = 0;
            for (int j = 0; j < nk; ++j) {
                const double mag = std::fabs(static_cast<double>(sc[j * ld + q])) + mx;
                big = std::max(big, mag);
                EXPECT_TRUE(near(sraw[j * ld + q], sc[j * ld + q], mag, exact))
                    << what << " P[" << j << "][" << q << "] " << sraw[j * ld + q] << " want " << sc[j * ld + q];
            }
            EXPECT_TRUE(near(l1[q], l0[q], big, exact)) << what << " l, column " << q << ": " << l1[q] << " want " << l0[q];
        }
    };
    std::vector<float> raw(static_cast<std::size_t>(nk * ld));
    for (float& x : raw) x = 40.0f * unit(rng);
    run(raw, 0.125f, "random");
    for (int j = 0; j < nk; ++j) {
        raw[static_cast<std::size_t>(j * ld + 16)] = j == 5 ? INFINITY : 1.0f;
        raw[static_cast<std::size_t>(j * ld + 17)] = j == 9 ? NAN : 2.0f;
        raw[static_cast<std::size_t>(j * ld + 18)] = j % 2 == 0 ? -INFINITY : 3.0f;
        raw[static_cast<std::size_t>(j * ld + 19)] = -INFINITY;
    }
    run(raw, 0.125f, "non-finite");
    for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = (i % ld < 16 ? 2000.0f : 80000.0f) * (1.0f + unit(rng));  // max ≈ 10^4 · c
    run(raw, 0.125f, "max past 2^8");
    for (float& x : raw) x = 20.0f * unit(rng);
    run(raw, 1e9f, "scale 10^9");
    for (float& x : raw) x = 0x1p127f * (1.5f + 0.4f * unit(rng));  // 2.2e38..3.1e38: max·log2 e overflows
    run(raw, 1.0f, "past 2^127 / log2 e");
}

// Without the float32 P (keep_f32 false) the softmax's exp2 leaves weights below 2^-126 denormal
// instead of 0 (flash_avx512_bf16.cpp, exp2_bf16_ps<false>): the same Pᵀ pairs (vcvtne2ps2bf16
// flushes them) and the same l as with keep_f32, bit for bit, on exponents across [−150, −120].
TEST(Bf16Compute, UnderflowingWeightsPackAsZero) {
    ATTN_NEED_BF16();
    const int nk = 64, ncols = 32, ld = 32;
    alignas(64) float s0[nk * ld], s1[nk * ld], m0[ncols], l0[ncols], a0[ncols], m1[ncols], l1[ncols], a1[ncols];
    alignas(64) std::uint32_t p0[nk / 2 * ld], p1[nk / 2 * ld];
    for (int j = 0; j < nk; ++j)
        for (int q = 0; q < ncols; ++q)  // key 0 the max (0); the others' x = s·log2 e from −120 to −150
            s0[j * ld + q] = j == 0 ? 0.0f : static_cast<float>((-120.0 - 30.0 * ((j * ncols + q) % 997) / 996.0) / 1.4426950408889634);
    std::memcpy(s1, s0, sizeof s0);
    for (int q = 0; q < ncols; ++q) m0[q] = m1[q] = -INFINITY, l0[q] = l1[q] = 0.0f;
    detail::flash_bf16_avx512_ns::softmax_bf16(s0, ld, nk, ncols, m0, l0, a0, p0, ld, false);
    detail::flash_bf16_avx512_ns::softmax_bf16(s1, ld, nk, ncols, m1, l1, a1, p1, ld, true);
    EXPECT_EQ(std::memcmp(p0, p1, sizeof p0), 0) << "Pᵀ pairs";
    EXPECT_EQ(std::memcmp(l0, l1, sizeof l0), 0) << "l";
    int zero = 0;  // the kept P's exact zeros (x < −126): the range crosses the threshold
    for (int j = 1; j < nk; ++j)
        for (int q = 0; q < ncols; ++q) zero += s1[j * ld + q] == 0.0f;
    EXPECT_GT(zero, 0);
    EXPECT_LT(zero, (nk - 1) * ncols);
}

// Non-finite V at masked keys and large finite V (the careful path) with bf16 compute.
TEST(Bf16Compute, NonFiniteAndLargeV) {
    ATTN_NEED_BF16();
    const std::int64_t Lq = 40, Lk = 70, D = 16;
    std::mt19937_64 rng(7);
    Case c = contiguous_case(rng, 1, 2, 2, Lq, Lk, D, D);
    c.opt.causal = Causal::top_left;
    c.desc = "non-finite/large V";
    // Keys past the last query (Lk > Lq, top-left causal: masked for every row) hold NaN/inf;
    // a visible key holds a value near the bf16 maximum.
    test::store(c.v, c.v.view().offset(0, 0, Lk - 1, 3), std::nan(""));
    test::store(c.v, c.v.view().offset(0, 1, Lk - 2, 0), INFINITY);
    test::store(c.v, c.v.view().offset(0, 1, 0, 5), 3.0e38);  // two: Σ p·v can overflow float32
    test::store(c.v, c.v.view().offset(0, 1, 1, 5), 3.0e38);
    const Out ref = reference(c);
    const Out got = run_flash(c, *row, 2);
    for (std::int64_t i = 0; i < got.out.numel(); ++i) {
        const double g = test::load(got.out, i), r = test::load(ref.out, i);
        ASSERT_TRUE(std::isfinite(g)) << "out[" << i << "] = " << g;
        EXPECT_NEAR(g, r, std::ldexp(1.0, -7) * std::max(1.0, std::fabs(r))) << "out[" << i << "]";
    }
}

}  // namespace
}  // namespace attn
