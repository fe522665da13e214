// The decode kernel against the double-precision reference on random problems: every
// storage type, Lq 1..16, odd head dims and lengths, GQA and MQA, per-sequence key
// lengths (fully masked rows included), both causal alignments, windows, element-wise
// masks, strided views, split-KV on and off, both ISA paths; then thread-count
// determinism, the sdpa dispatch rules and the error against an fp32 cache.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <limits>
#include <vector>

#include "attn/error.hpp"
#include "decode_util.hpp"
#include "kernels/decode/decode.hpp"
#include "kernels/isa.hpp"
#include "kernels/reference/reference.hpp"
#include "sdpa/problem.hpp"

namespace attn::test {
namespace {

// How a test runs the kernel: the key split (0 auto, 1 off, n chunks) and the kernel-table row.
struct DecodeTuning {
    std::int64_t split = 0;
    const detail::KernelSet* kernels = nullptr;
};

// Every kernel-table row this CPU can run (portable always, AVX2 when present).
std::vector<const detail::KernelSet*> rows() { return detail::runnable_kernel_sets(); }
const char* row_name(const detail::KernelSet* k) { return detail::isa_name(k->isa); }

// fp32 accumulation against the double reference on N(0,1) data with Dk <= 128 and up to
// ~1000 keys: the score error is a few ulp of scale·Σ|q·k| (≈ 1e-6), the output error a
// few ulp of max|V| (≈ 1e-6). 1e-5 + 1e-5·|ref| leaves ~10× margin for that and is far
// below what a wrong index, mask or merge gives (≈ 1e-1). The 16-bit storage types are
// held to the same bound: the reference reads the very same 16-bit values, so only fp32
// arithmetic separates them.
constexpr double kAtol = 1e-5, kRtol = 1e-5;

struct Case {
    std::int64_t B, Hkv, group, Lq, Lk, Dk, Dv;
    DType kv;
    Causal causal;
    bool lengths, window, bool_mask, add_mask, strided_q, cache_slice;
    std::int64_t split;  // 0 auto, 1 off, n chunks
    std::string str() const {
        return "B=" + std::to_string(B) + " Hkv=" + std::to_string(Hkv) + " group=" + std::to_string(group) +
               " Lq=" + std::to_string(Lq) + " Lk=" + std::to_string(Lk) + " Dk=" + std::to_string(Dk) +
               " Dv=" + std::to_string(Dv) + " kv=" + std::string(dtype_name(kv)) + " causal=" +
               std::to_string(static_cast<int>(causal)) + " lengths=" + std::to_string(lengths) +
               " window=" + std::to_string(window) + " masks=" + std::to_string(bool_mask) + std::to_string(add_mask) +
               " strided=" + std::to_string(strided_q) + std::to_string(cache_slice) + " split=" + std::to_string(split);
    }
};

// Owns every buffer of one problem; views may be strided into bigger buffers.
struct Problem {
    Tensor q_buf, k32, v32, k_buf, v_buf, lengths, bmask, amask;
    TensorView q, k, v;
    SdpaOptions opt;
};

Problem build(const Case& c, std::mt19937& rng) {
    Problem p;
    const std::int64_t Hq = c.Hkv * c.group;
    if (c.strided_q) {  // (B, Lq, Hq, Dk) buffer seen as (B, Hq, Lq, Dk): a projection's output
        p.q_buf = random_f32(Shape{c.B, c.Lq, Hq, c.Dk}, rng);
        p.q = p.q_buf.view().transpose(1, 2);
    } else {
        p.q_buf = random_f32(Shape{c.B, Hq, c.Lq, c.Dk}, rng);
        p.q = p.q_buf.view();
    }
    // K/V as the first Lk positions of a bigger cache buffer, or exactly (B, Hkv, Lk, D).
    const std::int64_t cap = c.cache_slice ? c.Lk + 5 : c.Lk;
    p.k32 = random_f32(Shape{c.B, c.Hkv, cap, c.Dk}, rng);
    p.v32 = random_f32(Shape{c.B, c.Hkv, cap, c.Dv}, rng);
    p.k_buf = to_storage(p.k32, c.kv);
    p.v_buf = to_storage(p.v32, c.kv);
    p.k = p.k_buf.view().slice(2, 0, c.Lk);
    p.v = p.v_buf.view().slice(2, 0, c.Lk);

    std::uniform_int_distribution<std::int64_t> len(0, c.Lk);
    if (c.lengths) {
        p.lengths = Tensor(DType::i64, Shape{c.B});
        for (std::int64_t b = 0; b < c.B; ++b) p.lengths.data_as<std::int64_t>()[b] = b == 0 ? c.Lk : len(rng);
        p.opt.key_lengths = p.lengths.view();
    }
    p.opt.causal = c.causal;
    std::bernoulli_distribution coin(0.5);
    if (c.window) {  // a left and/or right bound, either alignment
        std::uniform_int_distribution<std::int64_t> width(0, c.Lk);
        p.opt.window.left = coin(rng) ? width(rng) : -1;
        p.opt.window.right = p.opt.window.left < 0 || coin(rng) ? width(rng) / 4 : -1;
        p.opt.window.align = coin(rng) ? Align::bottom_right : Align::top_left;
    }
    // Masks of three broadcast shapes each: per sequence, per (b, h, i), shared by all.
    const Shape mask_shapes[] = {Shape{c.B, 1, 1, c.Lk}, Shape{c.B, Hq, c.Lq, c.Lk}, Shape{c.Lq, c.Lk}};
    if (c.bool_mask) {  // keep-mask: padding-style, per element, or one (Lq, Lk) pattern
        p.bmask = random_bool(mask_shapes[rng() % 3], rng, 0.8);
        p.opt.bool_mask = p.bmask.view();
    }
    if (c.add_mask) {  // bias with about 10 % −inf (masked) entries
        p.amask = random_f32(mask_shapes[rng() % 3], rng, 0.5f);
        for (std::int64_t i = 0; i < p.amask.numel(); ++i)
            if (rng() % 10 == 0) p.amask.data_as<float>()[i] = -INFINITY;
        p.opt.additive_mask = p.amask.view();
    }
    return p;
}

struct Result {
    Tensor out, lse;
};

Result run_reference(const Problem& p, const Case& c) {
    const std::int64_t Hq = c.Hkv * c.group;
    Result r{Tensor(DType::f32, Shape{c.B, Hq, c.Lq, c.Dv}), Tensor(DType::f32, Shape{c.B, Hq, c.Lq})};
    SdpaOptions o = p.opt;
    o.impl = Impl::reference;
    TensorView lse = r.lse.view();
    sdpa(p.q, p.k, p.v, o, r.out, &lse);
    return r;
}

Result run_decode(const Problem& p, const Case& c, const DecodeTuning& tuning) {
    const std::int64_t Hq = c.Hkv * c.group;
    Result r{Tensor(DType::f32, Shape{c.B, Hq, c.Lq, c.Dv}), Tensor(DType::f32, Shape{c.B, Hq, c.Lq})};
    poison(r.out);
    poison(r.lse);
    TensorView lse = r.lse.view();
    const detail::SdpaProblem prob = detail::make_problem(p.q, p.k, p.v, p.opt, r.out, &lse, nullptr);
    EXPECT_EQ(detail::decode_declines(prob), "");
    detail::decode_forward(prob, *tuning.kernels, tuning.split);
    return r;
}

Case random_case(std::mt19937& rng, int n) {
    auto pick = [&](std::initializer_list<std::int64_t> v) {
        return *(v.begin() + std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng));
    };
    std::bernoulli_distribution coin(0.5), rare(0.2);
    Case c{};
    c.B = pick({1, 1, 2, 3});
    c.Hkv = pick({1, 1, 2, 3});
    c.group = pick({1, 1, 2, 3, 4, 8});  // Hkv = 1 with group > 1 is MQA
    c.Lq = std::uniform_int_distribution<std::int64_t>(1, 16)(rng);
    // Around one key block (kDecodeBlock) and past two, so that every case runs on whatever block size.
    constexpr std::int64_t kb = detail::kDecodeBlock;
    c.Lk = pick({1, 2, 7, 16, 63, 64, 65, 129, kb - 1, kb, kb + 1, 2 * kb + 45, 777});
    c.Dk = pick({1, 3, 8, 16, 33, 64, 65, 128});
    c.Dv = coin(rng) ? c.Dk : pick({1, 7, 8, 24, 64, 72});
    c.kv = n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16;
    const int causal = static_cast<int>(pick({0, 1, 2, 2}));
    c.causal = causal == 0 ? Causal::none : causal == 1 ? Causal::top_left : Causal::bottom_right;
    c.lengths = coin(rng);
    c.window = rare(rng);
    c.bool_mask = rare(rng);
    c.add_mask = rare(rng);
    c.strided_q = coin(rng);
    c.cache_slice = coin(rng);
    c.split = pick({0, 0, 1, 2, 5});
    // Keep the double-precision reference cheap (test runtime): at most ~1.5e7 MACs.
    while (c.Lk > 1 && c.B * c.Hkv * c.group * c.Lq * c.Lk * (c.Dk + c.Dv) > 15'000'000) c.Lk = c.Lk / 3 + 1;
    return c;
}

TEST(DecodeKernel, RandomCasesMatchReference) {
    std::mt19937 rng(20261130);
    int cases = 0, runs = 0;
    double worst_ratio = 0, worst_abs = 0;
    for (int n = 0; n < 360; ++n) {
        const Case c = random_case(rng, n);
        const Problem p = build(c, rng);
        const Result ref = run_reference(p, c);
        for (const detail::KernelSet* row : rows()) {
            const Result got = run_decode(p, c, DecodeTuning{c.split, row});
            const Diff dout = compare(got.out, ref.out, kAtol, kRtol);
            const Diff dlse = compare(got.lse, ref.lse, kAtol, kRtol);
            ASSERT_EQ(dout.bad, 0) << c.str() << " " << row_name(row) << ": out max err " << dout.max_abs
                                   << " at " << dout.at;
            ASSERT_EQ(dlse.bad, 0) << c.str() << " " << row_name(row) << ": lse max err " << dlse.max_abs
                                   << " at " << dlse.at;
            worst_ratio = std::max({worst_ratio, dout.worst_ratio, dlse.worst_ratio});
            worst_abs = std::max(worst_abs, dout.max_abs);
            ++runs;
        }
        ++cases;
    }
    std::printf("[decode] %d random cases, %d kernel runs, max |out err| %.3g, worst err/tol %.3f\n", cases, runs,
                worst_abs, worst_ratio);
}

// Long keys with few heads: the automatic plan splits the keys (flash-decoding); forced
// splits with uneven chunks and sequences shorter than some chunks must agree too.
TEST(DecodeKernel, SplitKVLongSequences) {
    std::mt19937 rng(7);
    const DType kinds[] = {DType::f32, DType::f16, DType::bf16};
    int k = 0;
    for (std::int64_t split : {0, 1, 3, 16}) {
        Case c{1, 2, 4, 3, 4099, 64, 64, kinds[k++ % 3], Causal::bottom_right, true, false, false, false, false, true, split};
        c.B = 2;
        const detail::DecodePlan plan = detail::plan_decode(c.B, c.Hkv, c.group, c.Lq, c.Lk, c.Dk, c.Dv, split);
        if (split == 0) {
            EXPECT_GT(plan.nsplit, 1) << "B·Hkv = 4 with 4099 keys should split";
        }
        const Problem p = build(c, rng);
        const Result ref = run_reference(p, c);
        for (const detail::KernelSet* row : rows()) {
            const Result got = run_decode(p, c, DecodeTuning{split, row});
            const Diff d = compare(got.out, ref.out, kAtol, kRtol);
            EXPECT_EQ(d.bad, 0) << c.str() << " nsplit=" << plan.nsplit << " max err " << d.max_abs;
            EXPECT_EQ(compare(got.lse, ref.lse, kAtol, kRtol).bad, 0) << c.str();
        }
    }
}

TEST(DecodeKernel, PlanDependsOnShapeOnly) {
    // S5 (32 KV heads) has enough items without splitting; S7 (8 KV heads) and one
    // sequence with one head split; the plan never reads the thread count.
    EXPECT_EQ(detail::plan_decode(1, 32, 1, 1, 16384, 128, 128, 0).nsplit, 1);
    omp_set_num_threads(1);
    const auto a = detail::plan_decode(1, 1, 1, 1, 16384, 128, 128, 0);
    omp_set_num_threads(2);
    const auto b = detail::plan_decode(1, 1, 1, 1, 16384, 128, 128, 0);
    EXPECT_GT(a.nsplit, 1);
    EXPECT_EQ(a.nsplit, b.nsplit);
    EXPECT_EQ(a.chunk % detail::kDecodeBlock, 0);
    EXPECT_EQ(detail::plan_decode(1, 1, 1, 1, 5, 8, 8, 0).nsplit, 1);  // too short to split
}

// The sdpa dispatch runs the decode kernel of the kernel table's chosen row, and says which.
TEST(DecodeKernel, DispatchReportsTheKernelTableRow) {
    std::mt19937 rng(3);
    const Tensor q = random_f32(Shape{1, 2, 1, 8}, rng), k = random_f32(Shape{1, 2, 40, 8}, rng),
                 v = random_f32(Shape{1, 2, 40, 8}, rng);
    Tensor out(DType::f32, Shape{1, 2, 1, 8});
    for (const detail::KernelSet* row : rows()) {
        const detail::ScopedKernelSet use(*row);
        SdpaReport rep;
        sdpa(q, k, v, SdpaOptions{}, out, nullptr, nullptr, &rep);
        EXPECT_EQ(rep.kernel, std::string("decode/") + row_name(row)) << rep.explanation;
    }
}

// A size-1 dimension's stride addresses nothing, so numpy (and attn) accept any value there.
// The kernel must not walk memory by it: a one-key cache whose key dimension has a stride of
// 2^50 elements once made the page-head prefetch loop over billions of pages (a hang found by
// fuzz_array) and the P·V loop step a pointer past the end by 2^50 (UB; the ASan/UBSan suite
// runs this test). Every storage type, every kernel-table row, against the reference.
TEST(DecodeKernel, SizeOneDimsWithHugeStridesAreNotWalked) {
    std::mt19937 rng(11);
    const std::int64_t huge = std::int64_t{1} << 50, D = 24;
    const Tensor q = random_f32(Shape{1, 2, 1, D}, rng);
    const Tensor k32 = random_f32(Shape{1, 1, 1, D}, rng), v32 = random_f32(Shape{1, 1, 1, D}, rng);
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
        Tensor k = to_storage(k32, dt), v = to_storage(v32, dt);
        // B, H and L are all size 1: every stride but the head dim's is arbitrary.
        const TensorView kh(k.data(), dt, Shape{1, 1, 1, D}, Strides{huge, huge, huge, 1});
        const TensorView vh(v.data(), dt, Shape{1, 1, 1, D}, Strides{huge, 3, huge, 1});
        Tensor want(DType::f32, Shape{1, 2, 1, D});
        SdpaOptions opt;
        opt.impl = Impl::reference;
        sdpa(q, k, v, opt, want);
        for (const detail::KernelSet* row : rows()) {
            const detail::ScopedKernelSet use(*row);
            Tensor got(DType::f32, Shape{1, 2, 1, D});
            poison(got);
            opt.impl = Impl::decode;
            sdpa(q, kh, vh, opt, got);
            const Diff d = compare(got, want, 1e-5, 1e-5);
            EXPECT_EQ(d.bad, 0) << dtype_name(dt) << " " << row_name(row) << ": max err " << d.max_abs;
        }
    }
}

// Results must be bit-identical whatever the thread count (docs/design.md).
TEST(DecodeKernel, ThreadCountDoesNotChangeBits) {
    std::mt19937 rng(99);
    int compared = 0;
    for (int n = 0; n < 24; ++n) {
        Case c = random_case(rng, n);
        c.Lk = n % 2 ? 2000 : c.Lk;
        const Problem p = build(c, rng);
        for (const detail::KernelSet* row : rows()) {
            for (std::int64_t split : {0, 1, 4}) {
                omp_set_num_threads(1);
                const Result one = run_decode(p, c, DecodeTuning{split, row});
                omp_set_num_threads(2);
                const Result two = run_decode(p, c, DecodeTuning{split, row});
                ASSERT_EQ(std::memcmp(one.out.data(), two.out.data(), one.out.nbytes()), 0) << c.str();
                ASSERT_EQ(std::memcmp(one.lse.data(), two.lse.data(), one.lse.nbytes()), 0) << c.str();
                ++compared;
            }
        }
    }
    std::printf("[decode] %d problems bit-identical on 1 and 2 threads\n", compared);
}

// An item whose accumulator ends non-finite — a row sees a NaN or ±inf in V — is computed again
// on the careful path (decode_core.hpp, finite.hpp), and that pass must give the clean pass's
// bits wherever V cannot tell them apart: every row's lse (V does not enter it: the same m and
// l) and the out of every row that does not see the poisoned key. Each random case puts NaN,
// +inf or −inf in one sequence's last key of one KV head, under bottom-right causal masking, so
// the last query row of each head of that group sees it and the rows before it do not (Lq > 1);
// the clean run has 0 there and stays on the clean pass. Every storage type, mask, stride, split
// and kernel-table row: a site rounded one way in one pass and another way in the other (GCC's
// contraction, docs/conventions.md "Numerics and threads") gives lse 1 ulp apart. One case in
// four has every other V entry of the poisoned KV head −2^-149, the smallest negative float32:
// a row's weighted mean of them underflows to −0 where most of its weight is on keys of p < 1/2
// (their products round to 0), −0 on the clean pass (o·(1/l), o a few −2^-149) — and the careful
// pass gave +0 there (its large part's +0 added to the −0).
TEST(DecodeKernel, CarefulPassKeepsTheCleanPassBits) {
    std::mt19937 rng(20261207);
    const float poisons[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY};
    int items = 0, rows_compared = 0, negative_zero_rows = 0;
    for (int n = 0; n < 90; ++n) {
        Case c = random_case(rng, n);
        c.causal = Causal::bottom_right;
        c.lengths = false;  // key_lengths and windows could hide the last key from every row
        c.window = false;
        c.Lq = std::min(c.Lq, c.Lk);
        const std::mt19937 state = rng;
        std::mt19937 again = state;
        Problem poisoned = build(c, rng), clean = build(c, again);
        const std::int64_t b = static_cast<std::int64_t>(rng() % c.B), hk = static_cast<std::int64_t>(rng() % c.Hkv);
        const float x = poisons[n % 3];
        if (n % 4 == 3) {
            for (Problem* p : {&poisoned, &clean}) {
                float* vh = p->v32.data_as<float>() + (b * c.Hkv + hk) * p->v32.shape()[2] * c.Dv;
                std::fill(vh, vh + p->v32.shape()[2] * c.Dv, -std::numeric_limits<float>::denorm_min());
            }
        }
        for (std::int64_t d = 0; d < c.Dv; ++d) {
            poisoned.v32.data_as<float>()[((b * c.Hkv + hk) * poisoned.v32.shape()[2] + c.Lk - 1) * c.Dv + d] = x;
            clean.v32.data_as<float>()[((b * c.Hkv + hk) * clean.v32.shape()[2] + c.Lk - 1) * c.Dv + d] = 0.0f;
        }
        for (Problem* p : {&poisoned, &clean}) {
            p->v_buf = to_storage(p->v32, c.kv);
            p->v = p->v_buf.view().slice(2, 0, c.Lk);
        }
        for (const detail::KernelSet* row : rows()) {
            const Result got = run_decode(poisoned, c, DecodeTuning{c.split, row});
            const Result want = run_decode(clean, c, DecodeTuning{c.split, row});
            const std::string where = c.str() + " " + row_name(row) + " poison " + std::to_string(x);
            ASSERT_EQ(std::memcmp(got.lse.data(), want.lse.data(), got.lse.nbytes()), 0) << where << ": lse";
            bool saw = false, unseen = false;  // in the poisoned item: a row that sees the key, one that does not
            const std::int64_t Hq = c.Hkv * c.group;
            for (std::int64_t h = 0; h < Hq; ++h)
                for (std::int64_t i = 0; i < c.Lq; ++i) {
                    const std::int64_t at = ((b * Hq + h) * c.Lq + i) * c.Dv;  // outside the item too: clean there
                    const float* g = got.out.data_as<const float>() + at;
                    const float* w = want.out.data_as<const float>() + at;
                    const bool sees = !std::isfinite(g[0]);
                    if (h / c.group == hk) (sees ? saw : unseen) = true;
                    if (sees) {
                        ASSERT_TRUE(h / c.group == hk && i == c.Lq - 1) << where << ": row (" << h << ", " << i << ")";
                        continue;
                    }
                    ASSERT_EQ(std::memcmp(g, w, static_cast<std::size_t>(c.Dv) * sizeof(float)), 0)
                        << where << ": out row (" << h << ", " << i << ")";
                    ++rows_compared;
                    negative_zero_rows += h / c.group == hk && w[0] == 0.0f && std::signbit(w[0]);
                }
            items += saw && unseen;
        }
    }
    // Most cases see the poison (masks may hide it) with Lq > 1: items that took both passes.
    EXPECT_GT(items, 60);
    EXPECT_GT(negative_zero_rows, 0) << "no row of a −0 case was −0 on the clean pass: the −0 cases test nothing";
    std::printf("[decode] %d items with rows on both sides of a careful pass, %d rows bit-identical (%d of them −0)\n",
                items, rows_compared, negative_zero_rows);
}

// The error of storing K/V in 16 bits, against the fp32 answer, is bounded by the data:
// rounding each key changes each score by at most Δ = u·scale·max_j Σ_d |q_d·k_jd|,
// which moves every softmax weight by a factor within e^{±2Δ}, and rounding V adds
// u·|v|. So |O16 − O32| <= (e^{2Δ} − 1 + u)·max|V| (+ the fp32 tolerance), per row.
TEST(DecodeKernel, SixteenBitErrorAgainstFp32IsWithinDerivedBound) {
    std::mt19937 rng(5);
    for (DType dt : {DType::f16, DType::bf16}) {
        double worst = 0, worst_abs = 0;
        for (int n = 0; n < 12; ++n) {
            const std::int64_t B = 2, Hkv = 2, G = 2, Lq = 1 + n % 4, Lk = 257 + 100 * n, D = n % 2 ? 64 : 128;
            const Tensor q = random_f32(Shape{B, Hkv * G, Lq, D}, rng);
            const Tensor k = random_f32(Shape{B, Hkv, Lk, D}, rng), v = random_f32(Shape{B, Hkv, Lk, D}, rng);
            const Tensor k16 = to_storage(k, dt), v16 = to_storage(v, dt);
            SdpaOptions opt;
            opt.causal = Causal::bottom_right;
            Tensor o32(DType::f32, Shape{B, Hkv * G, Lq, D}), o16(DType::f32, Shape{B, Hkv * G, Lq, D});
            opt.impl = Impl::reference;
            sdpa(q, k, v, opt, o32);
            poison(o16);
            opt.impl = Impl::decode;
            sdpa(q, k16, v16, opt, o16);
            const double u = unit_roundoff(dt), scale = 1.0 / std::sqrt(static_cast<double>(D));
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t h = 0; h < Hkv * G; ++h) {
                    const std::int64_t hk = h / G;
                    double vmax = 0;
                    for (std::int64_t j = 0; j < Lk; ++j)
                        for (std::int64_t d = 0; d < D; ++d)
                            vmax = std::max(vmax, std::fabs(double(v.data_as<float>()[((b * Hkv + hk) * Lk + j) * D + d])));
                    for (std::int64_t i = 0; i < Lq; ++i) {
                        double delta = 0;
                        for (std::int64_t j = 0; j < Lk; ++j) {
                            double s = 0;
                            for (std::int64_t d = 0; d < D; ++d)
                                s += std::fabs(double(q.data_as<float>()[(((b * Hkv * G) + h) * Lq + i) * D + d]) *
                                               k.data_as<float>()[((b * Hkv + hk) * Lk + j) * D + d]);
                            delta = std::max(delta, u * scale * s);
                        }
                        const double bound = (std::expm1(2 * delta) + u) * vmax + kAtol;
                        for (std::int64_t d = 0; d < D; ++d) {
                            const std::int64_t at = (((b * Hkv * G) + h) * Lq + i) * D + d;
                            const double e = std::fabs(double(o16.data_as<float>()[at]) - o32.data_as<float>()[at]);
                            ASSERT_LE(e, bound) << dtype_name(dt) << " b=" << b << " h=" << h << " i=" << i;
                            worst = std::max(worst, e / bound);
                            worst_abs = std::max(worst_abs, e);
                        }
                    }
                }
        }
        std::printf("[decode] %s storage vs fp32: max |err| %.3g, worst err/bound %.3f\n",
                    std::string(dtype_name(dt)).c_str(), worst_abs, worst);
    }
}

// --- the dispatch rules through the public attn::sdpa ---

struct Small {
    Tensor q, k, v, out;
    Small(std::int64_t Lq, DType kv, std::mt19937& rng, std::int64_t Hq = 4, std::int64_t Hkv = 2)
        : q(random_f32(Shape{1, Hq, Lq, 8}, rng)),
          k(to_storage(random_f32(Shape{1, Hkv, 40, 8}, rng), kv)),
          v(to_storage(random_f32(Shape{1, Hkv, 40, 8}, rng), kv)),
          out(DType::f32, Shape{1, Hq, Lq, 8}) {}
};

// auto runs decode while its rows per KV head, group·Lq, are fewer than one flash panel with
// 16-bit K/V and two with float32 K/V — a panel is 32 queries on the avx512 row, 16 on the avx2
// and portable rows (docs/kernels.md, "Decode or flash") — and flash from there on; Lq > 16 is
// never decode's.
TEST(DecodeDispatch, AutoPicksDecodeBelowOneFlashPanel) {
    std::mt19937 rng(1);
    for (const detail::KernelSet* row : rows()) {
        const detail::ScopedKernelSet use(*row);
        const std::int64_t panel = row->isa == detail::Isa::avx512 ? 32 : 16;
        for (const std::int64_t group : {1, 2, 4, 8})
            for (const std::int64_t Lq : {1, 2, 3, 4, 7, 8, 15, 16}) {
                const DType kv = group == 8 ? DType::f16 : DType::f32;
                Small s(Lq, kv, rng, 2 * group, 2);
                SdpaReport report;
                poison(s.out);
                sdpa(s.q, s.k, s.v, SdpaOptions{}, s.out, nullptr, nullptr, &report);
                const std::int64_t limit = kv == DType::f32 ? 2 * panel : panel;
                const bool decode = group * Lq < limit;
                const std::string where = std::string(isa_name(row->isa)) + " group " + std::to_string(group) + " Lq " +
                                          std::to_string(Lq) + ": " + report.explanation;
                EXPECT_EQ(report.kernel.rfind(decode ? "decode/" : "flash/", 0), 0u) << where;
                if (decode) {
                    EXPECT_NE(report.explanation.find("auto: decode (group·Lq = " + std::to_string(group * Lq) +
                                                      " rows per KV head < " + std::to_string(limit) + ", "),
                              std::string::npos)
                        << where;
                } else {
                    EXPECT_NE(report.explanation.find("decode: declined, group·Lq = " + std::to_string(group * Lq) +
                                                      " rows per KV head reach " + std::to_string(limit) + ", " +
                                                      (kv == DType::f32 ? "two flash panels" : "one flash panel") + " of " +
                                                      std::to_string(panel)),
                              std::string::npos)
                        << where;
                }
                EXPECT_FALSE(still_poisoned(s.out)) << where;
                if (decode) continue;
                // impl = decode still runs decode on as many rows as it accepts (Lq <= 16): the
                // panel rule is auto's, not the kernel's. Both results against the reference.
                SdpaOptions forced, oracle;
                forced.impl = Impl::decode;
                oracle.impl = Impl::reference;
                Tensor dec(DType::f32, s.out.shape()), ref(DType::f32, s.out.shape());
                poison(dec);
                SdpaReport forced_report;
                sdpa(s.q, s.k, s.v, forced, dec, nullptr, nullptr, &forced_report);
                sdpa(s.q, s.k, s.v, oracle, ref);
                EXPECT_EQ(forced_report.kernel.rfind("decode/", 0), 0u) << where << " | forced: " << forced_report.explanation;
                for (std::int64_t e = 0; e < ref.numel(); ++e) {
                    const float r = ref.data_as<float>()[e];
                    EXPECT_NEAR(dec.data_as<float>()[e], r, 1e-5f * (1.0f + std::fabs(r))) << where << " (decode) at " << e;
                    EXPECT_NEAR(s.out.data_as<float>()[e], r, 1e-5f * (1.0f + std::fabs(r))) << where << " (flash) at " << e;
                }
            }
        Small big(17, DType::f32, rng);
        SdpaReport report;
        sdpa(big.q, big.k, big.v, SdpaOptions{}, big.out, nullptr, nullptr, &report);
        EXPECT_EQ(report.kernel.rfind("flash/", 0), 0u) << report.explanation;
        EXPECT_NE(report.explanation.find("decode: declined, Lq = 17 > 16"), std::string::npos) << report.explanation;
    }
}

TEST(DecodeDispatch, SixteenBitKVRulesAndMessages) {
    std::mt19937 rng(2);
    // Lq = 17 > 16 with float16 K/V: decode declines and flash runs it (no error, no
    // "convert K and V"); impl flash takes it directly; impl decode says why not.
    Small s(17, DType::f16, rng);
    SdpaReport auto_rep;
    sdpa(s.q, s.k, s.v, SdpaOptions{}, s.out, nullptr, nullptr, &auto_rep);
    EXPECT_EQ(auto_rep.kernel.rfind("flash/", 0), 0u) << auto_rep.explanation;
    EXPECT_NE(auto_rep.explanation.find("decode: declined, Lq = 17 > 16"), std::string::npos) << auto_rep.explanation;
    EXPECT_NE(auto_rep.explanation.find("K float16, V float16"), std::string::npos) << auto_rep.explanation;

    SdpaOptions flash;
    flash.impl = Impl::flash;
    EXPECT_EQ(error_of([&] { sdpa(s.q, s.k, s.v, flash, s.out); }), "(no error)");

    SdpaOptions dec;
    dec.impl = Impl::decode;
    const std::string dec_err = error_of([&] { sdpa(s.q, s.k, s.v, dec, s.out); });
    EXPECT_NE(dec_err.find("decode kernel cannot run this call: Lq = 17 > 16"), std::string::npos) << dec_err;

    // Weights are never formed by decode: with 16-bit K/V, flash forms them.
    Small w(2, DType::bf16, rng);
    Tensor weights(DType::f32, Shape{1, 4, 2, 40});
    TensorView wv = weights.view();
    SdpaReport w_rep;
    sdpa(w.q, w.k, w.v, SdpaOptions{}, w.out, nullptr, &wv, &w_rep);
    EXPECT_EQ(w_rep.kernel.rfind("flash/", 0), 0u) << w_rep.explanation;
    EXPECT_NE(w_rep.explanation.find("attention weights were requested"), std::string::npos) << w_rep.explanation;

    // The reference reads 16-bit K/V too (the oracle), and agrees with decode.
    Small r(3, DType::f16, rng);
    SdpaOptions ref;
    ref.impl = Impl::reference;
    Tensor o_ref(DType::f32, r.out.shape());
    sdpa(r.q, r.k, r.v, ref, o_ref);
    SdpaReport report;
    poison(r.out);
    sdpa(r.q, r.k, r.v, SdpaOptions{}, r.out, nullptr, nullptr, &report);
    EXPECT_EQ(report.kernel.rfind("decode/", 0), 0u) << report.explanation;
    EXPECT_EQ(compare(r.out, o_ref, kAtol, kRtol).bad, 0);

    // Validation: other dtypes for K/V still rejected, naming the argument.
    Tensor ki(DType::i32, Shape{1, 2, 40, 8}, true);
    const std::string v_err = error_of([&] { sdpa(r.q, ki, r.v, SdpaOptions{}, r.out); });
    EXPECT_EQ(v_err, "sdpa: K: dtype must be float32, float64, float16 or bfloat16 but got int32");
}

TEST(DecodeDispatch, FullyMaskedRowsGiveZeroAndMinusInf) {
    std::mt19937 rng(3);
    Small s(4, DType::f16, rng);
    Tensor lengths(DType::i32, Shape{1});
    lengths.data_as<std::int32_t>()[0] = 0;
    SdpaOptions opt;
    opt.key_lengths = lengths.view();
    Tensor lse(DType::f32, Shape{1, 4, 4});
    TensorView lv = lse.view();
    poison(s.out);
    poison(lse);
    sdpa(s.q, s.k, s.v, opt, s.out, &lv);
    for (std::int64_t i = 0; i < s.out.numel(); ++i) ASSERT_EQ(s.out.data_as<float>()[i], 0.0f);
    for (std::int64_t i = 0; i < lse.numel(); ++i) ASSERT_EQ(lse.data_as<float>()[i], -INFINITY);
}

}  // namespace
}  // namespace attn::test

namespace attn::test {
namespace {

// A GQA group's rows scored together (score_tile_rows, R = 2 or 4) give the bits of the same
// rows scored one at a time: each (row, key) dot product keeps the one-row tile's order over
// the head dim. The one-row run reads the single KV head through a head stride of 0 (group 1).
// Head dims with and without a 16-wide edge, key counts that end mid-tile, every storage type
// and kernel-table row, no key split. (8 rows take 64-key blocks where one row takes 256
// (decode_block): another softmax merge, so 8 rows only up to 64 keys, one block either way.)
TEST(DecodeKernel, GroupRowsGiveTheBitsOfRowsOneAtATime) {
    std::mt19937 rng(2026);
    int compared = 0;
    for (const std::int64_t Hq : {2, 4, 8})
        for (const std::int64_t D : {8, 24, 40, 64, 128})
            for (const std::int64_t Lk : {1, 3, 37, 300})
                for (const DType kv : {DType::f32, DType::f16, DType::bf16}) {
                    if (detail::decode_block(Hq) != detail::decode_block(1) && Lk > detail::decode_block(Hq)) continue;
                    const Tensor q = random_f32(Shape{1, Hq, 1, D}, rng);
                    const Tensor k = to_storage(random_f32(Shape{1, 1, Lk, D}, rng), kv);
                    const Tensor v = to_storage(random_f32(Shape{1, 1, Lk, D}, rng), kv);
                    const Shape wide{1, Hq, Lk, D};
                    const TensorView kw(k.data(), kv, wide, Strides{Lk * D, 0, D, 1});
                    const TensorView vw(v.data(), kv, wide, Strides{Lk * D, 0, D, 1});
                    for (const detail::KernelSet* row : rows()) {
                        Tensor grouped(DType::f32, Shape{1, Hq, 1, D}), single(DType::f32, Shape{1, Hq, 1, D});
                        poison(grouped);
                        poison(single);
                        const SdpaOptions opt;
                        detail::decode_forward(detail::make_problem(q, k, v, opt, grouped, nullptr, nullptr), *row, 1);
                        detail::decode_forward(detail::make_problem(q, kw, vw, opt, single, nullptr, nullptr), *row, 1);
                        ASSERT_EQ(std::memcmp(grouped.data(), single.data(), grouped.nbytes()), 0)
                            << row_name(row) << " Hq=" << Hq << " D=" << D << " Lk=" << Lk << " " << dtype_name(kv);
                        ++compared;
                    }
                }
    std::printf("[decode] %d group problems bit-identical to their rows one at a time\n", compared);
}

}  // namespace
}  // namespace attn::test
