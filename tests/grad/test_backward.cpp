// attn::sdpa_backward: the tiled fp32 kernel (AVX2 and portable) against the double
// reference on random shapes and every mask kind; finite differences for the reference;
// determinism across runs and thread counts; fully masked rows; argument errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "attn/error.hpp"
#include "common/address_space.hpp"
#include "core/cpu_features.hpp"
#include "grad_util.hpp"
#include "kernels/backward/backward.hpp"

namespace attn::test {
namespace {

struct Case {
    std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    Causal causal = Causal::none;
    Window window{};
    int mask = 0;  // 0 none, 1 bool (Lq, Lk), 2 additive (B, 1, Lq, Lk) with −inf, 3 bool (B, Hq, Lq, Lk)
    bool key_lengths = false;
    bool strided = false;  // q and dO as transposed (B, L, H, D) buffers
    double dropout = 0.0;
    std::string str() const {
        char buf[256];
        std::snprintf(buf, sizeof buf, "B=%ld Hq=%ld Hkv=%ld Lq=%ld Lk=%ld Dk=%ld Dv=%ld causal=%d win=(%ld,%ld,%d) mask=%d kl=%d strided=%d p=%.2f",
                      (long)B, (long)Hq, (long)Hkv, (long)Lq, (long)Lk, (long)Dk, (long)Dv, (int)causal,
                      (long)window.left, (long)window.right, (int)window.align, mask, (int)key_lengths, (int)strided, dropout);
        return buf;
    }
};

// The inputs of one case; masks and key lengths are owned here, options point at them.
struct Inputs {
    Tensor q_buf, dO_buf, k, v, mask, kl;
    TensorView q, dO;
    SdpaOptions opt;
};

Inputs make_inputs(const Case& c, DType dt, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    Inputs in;
    if (c.strided) {
        in.q_buf = randn(dt, Shape{c.B, c.Lq, c.Hq, c.Dk}, rng);
        in.dO_buf = randn(dt, Shape{c.B, c.Lq, c.Hq, c.Dv}, rng);
        in.q = in.q_buf.view().transpose(1, 2);
        in.dO = in.dO_buf.view().transpose(1, 2);
    } else {
        in.q_buf = randn(dt, Shape{c.B, c.Hq, c.Lq, c.Dk}, rng);
        in.dO_buf = randn(dt, Shape{c.B, c.Hq, c.Lq, c.Dv}, rng);
        in.q = in.q_buf.view();
        in.dO = in.dO_buf.view();
    }
    in.k = randn(dt, Shape{c.B, c.Hkv, c.Lk, c.Dk}, rng);
    in.v = randn(dt, Shape{c.B, c.Hkv, c.Lk, c.Dv}, rng);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (c.mask == 1 || c.mask == 3) {
        in.mask = c.mask == 1 ? Tensor(DType::boolean, Shape{c.Lq, c.Lk}) : Tensor(DType::boolean, Shape{c.B, c.Hq, c.Lq, c.Lk});
        for (std::int64_t i = 0; i < in.mask.numel(); ++i) in.mask.data_as<bool>()[i] = u(rng) > 0.3;
        in.opt.bool_mask = in.mask.view();
    } else if (c.mask == 2) {
        in.mask = randn(dt, Shape{c.B, 1, c.Lq, c.Lk}, rng);
        for (std::int64_t i = 0; i < in.mask.numel(); ++i)
            if (u(rng) < 0.2) {
                if (dt == DType::f32) in.mask.data_as<float>()[i] = -INFINITY;
                else in.mask.data_as<double>()[i] = -INFINITY;
            }
        in.opt.additive_mask = in.mask.view();
    }
    if (c.key_lengths) {
        in.kl = Tensor(DType::i64, Shape{c.B});
        for (std::int64_t b = 0; b < c.B; ++b) in.kl.data_as<std::int64_t>()[b] = b == 0 ? 0 : static_cast<std::int64_t>(rng() % (c.Lk + 1));
        in.opt.key_lengths = in.kl.view();
    }
    in.opt.causal = c.causal;
    in.opt.window = c.window;
    in.opt.dropout_p = c.dropout;
    in.opt.dropout_seed = seed * 7919 + 1;
    return in;
}

std::vector<Case> random_cases(int n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto pick = [&](std::initializer_list<std::int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
    std::vector<Case> cases;
    for (int t = 0; t < n; ++t) {
        Case c;
        c.B = pick({1, 2});
        c.Hkv = pick({1, 2});
        c.Hq = c.Hkv * pick({1, 1, 2, 3});
        c.Lq = pick({1, 7, 63, 64, 65, 100, 130});
        c.Lk = pick({1, 5, 63, 64, 65, 129, 200});
        c.Dk = pick({1, 8, 13, 16, 32, 64, 72});
        c.Dv = rng() % 3 == 0 ? pick({1, 8, 20, 64}) : c.Dk;
        c.causal = static_cast<Causal>(rng() % 3);
        if (rng() % 5 == 0) c.window = Window{static_cast<std::int64_t>(rng() % 20), static_cast<std::int64_t>(rng() % 4) - 1,
                                              rng() % 2 ? Align::top_left : Align::bottom_right};
        c.mask = static_cast<int>(rng() % 4);
        c.key_lengths = rng() % 4 == 0;
        c.strided = rng() % 3 == 0;
        c.dropout = rng() % 4 == 0 ? 0.25 : 0.0;
        cases.push_back(c);
    }
    return cases;
}

// Error budget of the fp32 tiled kernel against the double reference, relative to the
// largest reference gradient of the case (dQ, dK or dV — a dQ that cancels to 0 in exact
// arithmetic leaves fp32 residue of the size of the other gradients' rounding): every product and exp is fp32 (ε = 6e-8) and sums run
// over up to max(Lk, Lq)·max(Dk, Dv) ≈ 2·10⁴ terms; with random signs the error grows
// like √n·ε·(term size): √(2·10⁴)·6e-8 ≈ 1e-5 of the largest gradient. Tolerance 2e-5
// (the observed maximum, printed, is ≈ 1e-6).
constexpr double kTol = 2e-5;

// Expects each gradient of `got` within kTol of the largest gradient of `ref`; returns the
// worst error so measured.
double expect_float32_bound(const Grads& got, const Grads& ref) {
    const double den = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
    double worst = 0.0;
    for (auto [g, r, name] : {std::tuple{&got.dq, &ref.dq, "dq"}, std::tuple{&got.dk, &ref.dk, "dk"},
                              std::tuple{&got.dv, &ref.dv, "dv"}}) {
        const double e = max_abs_diff(*g, *r) / (den + 1e-30);
        worst = std::max(worst, e);
        EXPECT_LE(e, kTol) << name;
    }
    return worst;
}

// random_cases with the sizes at the edges of the avx512 tile's GEMM (tile_avx512_gemm.inl: 6 × 64
// micro-tiles on 1–4 vectors of 16 columns, the last under a mask): head dims padded to 40, 48, 104
// and 120 columns (3 vectors; 64 + 3; 64 + 4, the last masked), ragged key blocks of 40 and 47 keys
// (S and dP of 3 vectors), and query counts that leave 1–5 rows of a 6-row step.
std::vector<Case> tile_edge_cases(int n, std::uint64_t seed) {
    std::vector<Case> cases = random_cases(n, seed);
    std::mt19937_64 rng(seed + 1);
    auto pick = [&](std::initializer_list<std::int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
    for (Case& c : cases) {
        c.Lq = pick({5, 13, 40, 70, 103});
        c.Lk = pick({40, 47, 104, 175});
        c.Dk = pick({33, 40, 47, 100, 120});
        c.Dv = rng() % 3 == 0 ? pick({36, 48, 112}) : c.Dk;
    }
    return cases;
}

// Forward and backward both run the kernel table's `isa` row (ScopedKernelSet).
void check_against_reference(detail::Isa isa, int ncases, std::uint64_t seed,
                             std::vector<Case> (*cases)(int, std::uint64_t) = random_cases) {
    const detail::KernelSet* row = detail::kernel_set_for(isa);
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks " << detail::missing_features(isa);
    const detail::ScopedKernelSet use(*row);
    double worst = 0.0;
    for (const Case& c : cases(ncases, seed)) {
        SCOPED_TRACE(c.str());
        const Inputs f = make_inputs(c, DType::f32, seed ^ 0x5eed);
        SdpaReport rep;
        const Grads got = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::flash, DType::f32, &rep);
        ASSERT_EQ(rep.kernel, std::string("flash-backward/") + detail::isa_name(isa)) << rep.explanation;
        const Grads ref = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::reference, DType::f64);
        worst = std::max(worst, expect_float32_bound(got, ref));
    }
    std::printf("[ info ] %d random cases, %s tile: worst relative error %.3g (tolerance %.0e)\n", ncases,
                detail::isa_name(isa), worst, kTol);
}

TEST(FlashBackward, MatchesReferenceAvx512) { check_against_reference(detail::Isa::avx512, 120, 3); }

TEST(FlashBackward, MatchesReferenceAvx512AtMicroTileEdges) { check_against_reference(detail::Isa::avx512, 24, 11, tile_edge_cases); }

// Query rows past the L2: with the rows of a KV head's query heads larger than the L2 (S3's case,
// Plan::rows_ahead) the avx512 tile's S and dP products request the next query tile's Q and dO
// rows, and on every shape the next pass's K and V rows (tile.hpp, RowsAhead) — in the fused
// products and in the unfused ones (a score rule, softcap, ALiBi, dropout). A request changes no
// value; this checks the requesting calls against the double reference on such shapes, with every
// mask kind, GQA, strided Q/dO and each modifier, and 1 thread against 2 bit for bit. (Past the
// L2 of a core of up to 2 MiB: where the L2 is larger the same shapes run without the Q/dO
// requests and still check the K/V ones.)
TEST(FlashBackward, MatchesReferenceAvx512RowsPastTheL2) {
    const detail::KernelSet* row = detail::kernel_set_for(detail::Isa::avx512);
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks " << detail::missing_features(detail::Isa::avx512);
    const detail::ScopedKernelSet use(*row);
    std::vector<Case> cases = random_cases(6, 21);
    std::mt19937_64 rng(22);
    auto pick = [&](std::initializer_list<std::int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
    const int threads = omp_get_max_threads();
    double worst = 0.0;
    for (std::size_t n = 0; n < cases.size(); ++n) {
        Case& c = cases[n];
        c.B = 1;
        c.Hkv = 1;
        c.Hq = pick({1, 2});
        c.Lq = pick({2049, 2500});  // Q, dO and dQ rows of 2049 · (2·128 + 128) · 4 bytes: 3.1 MB a head
        c.Lk = pick({200, 300});     // 4–5 key blocks: 2–3 passes of 2
        c.Dk = c.Dv = 128;
        c.key_lengths = false;       // (B = 1: the key length of batch 0 is 0 in make_inputs)
        SCOPED_TRACE(c.str() + " modifier " + std::to_string(n % 3));
        Inputs f = make_inputs(c, DType::f32, 23 + n);
        const Tensor slopes = alibi_slopes(c.Hq);
        if (n % 3 == 1) f.opt.softcap = 2.5;
        if (n % 3 == 2) f.opt.alibi_slopes = slopes.view();
        SdpaReport rep;
        omp_set_num_threads(1);
        const Grads got = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::flash, DType::f32, &rep);
        ASSERT_EQ(rep.kernel, std::string("flash-backward/avx512")) << rep.explanation;
        omp_set_num_threads(2);
        const Grads got2 = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::flash, DType::f32);
        EXPECT_TRUE(bit_equal(got.dq, got2.dq) && bit_equal(got.dk, got2.dk) && bit_equal(got.dv, got2.dv));
        const Grads ref = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::reference, DType::f64);
        worst = std::max(worst, expect_float32_bound(got, ref));
    }
    omp_set_num_threads(threads);
    std::printf("[ info ] %zu cases past the L2, avx512 tile: worst relative error %.3g (tolerance %.0e)\n", cases.size(),
                worst, kTol);
}

// dK and dV larger than the L2 are written by non-temporal stores (backward_plan.hpp,
// Plan::stream_dkv; stream_rows) where they are float32 rows of whole 64-byte lines — head dims
// 64 and 128 here — and row by row otherwise (72: 288-byte rows). On every kernel row, against the
// double reference, and 1 thread against 2 bit for bit (each task fences its own streams).
TEST(FlashBackward, MatchesReferenceWithDkDvPastTheL2) {
    const std::int64_t l2 = detail::cpu_features().l2_bytes;
    std::vector<Case> cases = random_cases(4, 51);
    std::mt19937_64 rng(52);
    auto pick = [&](std::initializer_list<std::int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
    for (std::size_t n = 0; n < cases.size(); ++n) {
        Case& c = cases[n];
        c.B = 1;
        c.Hkv = 2;
        c.Hq = c.Hkv * pick({1, 2});
        c.Lq = pick({7, 65, 100});
        c.Dk = c.Dv = n == 3 ? 72 : pick({64, 128});
        // the keys that make B·Hkv·Lk·(Dk + Dv) floats just more than the L2, then a ragged block
        c.Lk = l2 / (c.B * c.Hkv * (c.Dk + c.Dv) * 4) + pick({1, 37, 64});
        c.key_lengths = false;  // (B = 1: the key length of batch 0 is 0 in make_inputs)
        ASSERT_GT(c.B * c.Hkv * c.Lk * (c.Dk + c.Dv) * 4, l2);
    }
    const int threads = omp_get_max_threads();
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        double worst = 0.0;
        for (std::size_t n = 0; n < cases.size(); ++n) {
            const Case& c = cases[n];
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + ", " + c.str());
            const Inputs f = make_inputs(c, DType::f32, 53 + n);
            SdpaReport rep;
            omp_set_num_threads(1);
            const Grads got = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::flash, DType::f32, &rep);
            ASSERT_EQ(rep.kernel, std::string("flash-backward/") + detail::isa_name(row->isa)) << rep.explanation;
            omp_set_num_threads(2);
            const Grads got2 = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::flash, DType::f32);
            EXPECT_TRUE(bit_equal(got.dq, got2.dq) && bit_equal(got.dk, got2.dk) && bit_equal(got.dv, got2.dv));
            const Grads ref = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::reference, DType::f64);
            worst = std::max(worst, expect_float32_bound(got, ref));
        }
        std::printf("[ info ] dK/dV past the L2 (%lld bytes), %s tile: worst relative error %.3g (tolerance %.0e)\n",
                    static_cast<long long>(l2), detail::isa_name(row->isa), worst, kTol);
    }
    omp_set_num_threads(threads);
}

// Q, K, V and dO with their heads and rows reversed, on every kernel row, against the reference on
// the same views: negative offsets. The avx512 tile's requests for the next pass's and the next
// task's rows once made them unsigned — a wrapped address, harmless to a request (it never faults)
// and so invisible here; clang's UBSan reported it (fuzz_array, its input now
// fuzz/corpus/fuzz_array/regress-backward-reversed-rows-ahead), GCC's does not instrument that add.
// On 1 thread: a thread asks for the next task's rows only when it takes another task itself.
TEST(FlashBackward, ReversedViewsMatchReference) {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        double worst = 0.0;
        for (const Case& c : random_cases(12, 41)) {
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + ", " + c.str());
            const Inputs f = make_inputs(c, DType::f32, 42);
            const TensorView q = reversed_dims(f.q, {1, 2}), k = reversed_dims(f.k.view(), {1, 2}),
                             v = reversed_dims(f.v.view(), {2}), dO = reversed_dims(f.dO, {1});
            SdpaReport rep;
            const Grads got = forward_backward(q, k, v, dO, f.opt, Impl::flash, DType::f32, &rep);
            ASSERT_EQ(rep.kernel, std::string("flash-backward/") + detail::isa_name(row->isa)) << rep.explanation;
            const Grads ref = forward_backward(q, k, v, dO, f.opt, Impl::reference, DType::f64);
            worst = std::max(worst, expect_float32_bound(got, ref));
        }
        std::printf("[ info ] reversed views, %s tile: worst relative error %.3g (tolerance %.0e)\n",
                    detail::isa_name(row->isa), worst, kTol);
    }
    omp_set_num_threads(threads);
}

TEST(FlashBackward, MatchesReferenceAvx2) { check_against_reference(detail::Isa::avx2, 120, 1); }

TEST(FlashBackward, MatchesReferencePortable) { check_against_reference(detail::Isa::portable, 40, 2); }

// Tiny and huge scales. The problem at scale s0·2^-a with Q times 2^q, K times 2^k (q + k = a) and
// dO times 2^o (pow2_splits, grad_util.hpp) has the same scores, so the same P, as at s0, and
// P∘(dP − D) times 2^o: its exact dQ is 2^(o-q), dK 2^(o-k) and dV 2^o times s0's. On every kernel
// row, with and without a softcap: (1) the gradients the problem does not shrink, brought back to
// s0's (undo_split), are the run at s0's bit for bit — each step of the tiled kernel scales by a
// power of two — unless an intermediate leaves the normal float32 range, as dS =
// scale·P∘(dP − D) did below 2^-63 (subnormal: bits lost) and above 2^63 (past FLT_MAX: inf, NaN
// gradients, at 2^99 with dO times 2^40); (2) against the double reference, both brought back,
// they are within the float32 bound of the problem at s0, whose inputs are of unit scale.
// (Relative to the largest gradient of the scaled problem the bound would not hold at a huge
// scale: where the exact dK is 0 — one key, say — its rounding noise grows with 2^-a and dV does
// not.) s0 = 2^kBaseScaleExponent (grad_util.hpp).
TEST(FlashBackward, TinyAndHugeScales) {
    const std::vector<Case> cases = random_cases(6, 5);
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        double worst = 0.0;
        for (std::size_t ci = 0; ci < cases.size(); ++ci) {
            const Case& c = cases[ci];
            const double softcap = ci % 2 == 1 ? 1.0 : 0.0;  // every other case: the tile scales and caps S itself
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + " softcap " + std::to_string(softcap) + ", " + c.str());
            const std::uint64_t seed = 500 + ci;
            Inputs at_s0 = make_inputs(c, DType::f32, seed);
            at_s0.opt.scale = std::ldexp(1.0, kBaseScaleExponent);
            at_s0.opt.softcap = softcap;
            const Grads base = forward_backward(at_s0.q, at_s0.k, at_s0.v, at_s0.dO, at_s0.opt, Impl::flash);
            for (const int e : kScaleExponents)
                for (const Pow2Split sp : pow2_splits(kBaseScaleExponent - e)) {
                    SCOPED_TRACE("scale 2^" + std::to_string(e) + ", Q times 2^" + std::to_string(sp.q) + ", K times 2^" +
                                 std::to_string(sp.k) + ", dO times 2^" + std::to_string(sp.o));
                    Inputs f = make_inputs(c, DType::f32, seed);
                    apply_split(f, sp);
                    f.opt.scale = std::ldexp(1.0, e);
                    f.opt.softcap = softcap;
                    SdpaReport rep;
                    Grads got = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::flash, DType::f32, &rep);
                    ASSERT_EQ(rep.kernel, std::string("flash-backward/") + detail::isa_name(row->isa));
                    Grads ref = forward_backward(f.q, f.k, f.v, f.dO, f.opt, Impl::reference, DType::f64);
                    undo_split(got, sp);
                    undo_split(ref, sp);
                    expect_twin_bits(got, base, sp);
                    worst = std::max(worst, expect_float32_bound(got, ref));
                }
        }
        std::printf("[ info ] %s tile, scales 2^-126 .. 2^99: worst relative error %.3g (tolerance %.0e)\n",
                    detail::isa_name(row->isa), worst, kTol);
    }
}

// Huge scales with unit-scale Q and K (docs/conventions.md, "Shapes of attn::sdpa"): the backward
// recomputes the scores in float32, and their rounding, of order scale·Dk·2^-24, is an error in
// the exponent of P = exp(s − lse), which came out far above 1: dV 20 to 6000 at 3·10^6, where its
// exact value is below 7, and dQ, dK, dV inf or NaN on every kernel row from 10^8 or 10^9 to
// 3·10^36 (the largest tried). P cannot exceed 1 exactly; clamped to 1, every gradient is finite
// and dV = Σ_i P_ij·dO_i within Σ_i |dO_i| (and rounding).
// The flash forward's out and lse, as training would pass them.
TEST(FlashBackward, HugeScalesWithUnitScoresGiveFiniteGradients) {
    for (const double scale : {3e6, 1e8, 1e9, 1e10, 1e15, 1e20, 1e30, 3e36})  // 3e36·|q·k| stays below FLT_MAX
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            const detail::ScopedKernelSet use(*row);
            // float32: the sum of 65 terms rounded, 65·2^-24 at most
            EXPECT_EQ(expect_finite_gradients_at_huge_scale(DType::f32, scale, 65 * 0x1p-24),
                      std::string("flash-backward/") + detail::isa_name(row->isa));
        }
}

// The split's rule (docs/kernels.md, "Parallel split"): at least 8 tasks, four per CPU when the
// target says so, the dQ partials past 8 tasks capped at 256 MiB (64 Mi floats), 1..key blocks.
// S1: B·Hkv 16, 16 key blocks, dQ 16·1024·64 floats; S3: 64 key blocks, 16·4096·128 floats.
TEST(FlashBackward, ChunksPerMachineSize) {
    constexpr std::int64_t kS1Dq = 16 * 1024 * 64, kS3Dq = 16 * 4096 * 128, kMi = std::int64_t{1} << 20;
    // 2 CPUs (target 8): the old rule, ⌈8 / (B·Hkv)⌉.
    EXPECT_EQ(detail::backward_chunks(16, 16, kS1Dq, 8), 1);
    EXPECT_EQ(detail::backward_chunks(16, 64, kS3Dq, 8), 1);
    EXPECT_EQ(detail::backward_chunks(3, 16, 100, 8), 3);
    EXPECT_EQ(detail::backward_chunks(1, 16, 100, 8), 8);
    EXPECT_EQ(detail::backward_chunks(1, 5, 100, 8), 5);     // no more chunks than key blocks
    EXPECT_EQ(detail::backward_chunks(1, 0, 100, 8), 1);     // Lk = 0: one (empty) chunk
    EXPECT_EQ(detail::backward_chunks(1, 64, 40 * kMi, 8), 8);  // the 8-task floor ignores the cap
    // 16, 32 and 64 CPUs (targets 64, 128, 256): four tasks per CPU.
    EXPECT_EQ(detail::backward_chunks(16, 16, kS1Dq, 64), 4);
    EXPECT_EQ(detail::backward_chunks(16, 16, kS1Dq, 128), 8);
    EXPECT_EQ(detail::backward_chunks(16, 16, kS1Dq, 256), 16);
    EXPECT_EQ(detail::backward_chunks(16, 64, kS3Dq, 64), 4);
    EXPECT_EQ(detail::backward_chunks(16, 64, kS3Dq, 128), 8);
    EXPECT_EQ(detail::backward_chunks(16, 64, kS3Dq, 256), 8);  // 8 partials of 32 MiB: the cap
    EXPECT_EQ(detail::backward_chunks(1, 64, 40 * kMi, 256), 8);  // past the cap: the floor
    EXPECT_EQ(detail::backward_chunks(5, 1000, 100, 256), 52);   // ⌈256 / 5⌉
}

// A per-thread buffer the flash backward cannot get is attn::OutOfMemory, not std::terminate:
// it was sized inside the OpenMP region, which an exception may not leave (a test under an
// address-space limit found the abort). float16 Q and dO of 2^18 rows: each thread's task holds
// float32 copies of them, 64 MiB each, more than the 48 MiB the child leaves itself. In a child
// process ("threadsafe" death test); not under ASan, whose shadow memory needs more.
#if !defined(ATTN_TEST_SANITIZED_MEMORY)
[[noreturn]] void flash_backward_under_an_address_space_limit() {
    const std::int64_t L = std::int64_t{1} << 18;
    std::mt19937 rng(41);
    const Tensor q = randn(DType::f16, Shape{1, 1, L, 64}, rng), dO = randn(DType::f16, Shape{1, 1, L, 64}, rng);
    const Tensor k = randn(DType::f32, Shape{1, 1, 64, 64}, rng), v = randn(DType::f32, Shape{1, 1, 64, 64}, rng);
    Tensor out(DType::f16, Shape{1, 1, L, 64}), lse(DType::f32, Shape{1, 1, L});
    Tensor dq(DType::f16, Shape{1, 1, L, 64}), dk(DType::f32, Shape{1, 1, 64, 64}), dv(DType::f32, Shape{1, 1, 64, 64});
    SdpaOptions o;
    o.impl = Impl::flash;
    const TensorView lse_view = lse;
    attn::sdpa(q, k, v, o, out, &lse_view);
    {  // start OpenMP's threads (and their small buffers) before the limit
        const TensorView s = q.view().slice(2, 0, 64), so = out.view().slice(2, 0, 64), sl = lse.view().slice(2, 0, 64);
        const TensorView sd = dO.view().slice(2, 0, 64), sq = dq.view().slice(2, 0, 64);
        attn::sdpa_backward(s, k, v, so, sl, sd, o, sq, dk, dv);
    }
    attn::test::limit_address_space(48ul << 20);
    try {
        attn::sdpa_backward(q, k, v, out, lse, dO, o, dq, dk, dv);
        std::exit(4);  // ran: the limit did not bite
    } catch (const attn::OutOfMemory& e) {
        std::exit(std::string(e.what()).find("the flash backward's buffers of one thread") == std::string::npos ? 3 : 0);
    } catch (...) {
        std::exit(6);
    }
}

TEST(FlashBackwardDeathTest, PerThreadBufferOutOfMemoryIsAnError) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    // Exit codes: 0 attn::OutOfMemory naming the buffers; 3 another message; 4 no error; 5 no
    // limit; 6 another exception; a signal: std::terminate.
    EXPECT_EXIT(flash_backward_under_an_address_space_limit(), ::testing::ExitedWithCode(0), "");
}
#endif

}  // namespace
}  // namespace attn::test
