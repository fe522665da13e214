// attn's packed GEMM (src/gemm/gemm.hpp) on every kernel-table row this CPU runs (the others
// are reported as skipped): random shapes with odd M, N, K (edge micro-tiles, several K
// chunks, several column blocks), every transpose, padded leading dimensions, beta 0 and 1
// (and 0.5), against a double-precision reference; C is NaN-poisoned when beta = 0 and its
// padding columns always are. And the determinism contract: 1 and 2 threads bit-identical.
//
// Bound: each element is a chain of rounded float operations — K FMAs, at most one addition
// per K chunk (fewer than K), the beta term — so at most 2K + 2 roundings of unit 2^-24, and
// |computed − exact| <= (2K + 2)·2^-24·(Σ_k |a·b| + |beta·c|) (plus the reference's own
// double rounding, ~1e-16 relative: nothing at this scale).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/half.hpp"
#include "core/cpu_features.hpp"
#include "gemm/gemm.hpp"
#include "kernels/isa.hpp"

namespace attn::detail {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Problem {
    bool ta = false, tb = false;
    std::int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
    float beta = 0.0f;
    std::vector<float> a, b, c0;  // c0: C before the call
};

Problem make(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float beta, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    std::uniform_int_distribution<int> pad(0, 9);
    Problem p;
    p.ta = ta;
    p.tb = tb;
    p.M = M;
    p.N = N;
    p.K = K;
    p.beta = beta;
    p.lda = (ta ? M : K) + pad(rng);
    p.ldb = (tb ? K : N) + pad(rng);
    p.ldc = N + pad(rng);
    p.a.resize(static_cast<std::size_t>((ta ? K : M) * p.lda));
    p.b.resize(static_cast<std::size_t>((tb ? N : K) * p.ldb));
    p.c0.assign(static_cast<std::size_t>(M * p.ldc), kNaN);
    // A's and B's padding is NaN too: a GEMM that read it would show it.
    for (std::int64_t r = 0; r < (ta ? K : M); ++r)
        for (std::int64_t k = 0; k < p.lda; ++k) p.a[static_cast<std::size_t>(r * p.lda + k)] = k < (ta ? M : K) ? nd(rng) : kNaN;
    for (std::int64_t r = 0; r < (tb ? N : K); ++r)
        for (std::int64_t k = 0; k < p.ldb; ++k) p.b[static_cast<std::size_t>(r * p.ldb + k)] = k < (tb ? K : N) ? nd(rng) : kNaN;
    if (beta != 0.0f)  // beta = 0: C stays NaN, which must not reach the result
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) p.c0[static_cast<std::size_t>(i * p.ldc + j)] = nd(rng);
    return p;
}

// p's sizes, layout, beta and float32 operands, writing C into c.
GemmArgs args_of(const Problem& p, std::vector<float>& c) {
    GemmArgs g;
    g.ta = p.ta;
    g.tb = p.tb;
    g.M = p.M;
    g.N = p.N;
    g.K = p.K;
    g.A = p.a.data();
    g.lda = p.lda;
    g.B = p.b.data();
    g.ldb = p.ldb;
    g.beta = p.beta;
    g.C = c.data();
    g.ldc = p.ldc;
    return g;
}

// l2: the L2 size the blocks are fitted to (GemmArgs::l2_bytes; 0: this CPU's).
std::vector<float> run(const KernelSet& row, const Problem& p, int threads, std::int64_t l2 = 0) {
    std::vector<float> c = p.c0;
    GemmArgs g = args_of(p, c);
    g.l2_bytes = l2;
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    sgemm(row, g);
    omp_set_num_threads(before);
    return c;
}

// The worst |error| / bound over C, and whether every padding column is still NaN.
double worst_ratio(const Problem& p, const std::vector<float>& c, bool* padding_kept) {
    double worst = 0.0;
    *padding_kept = true;
    for (std::int64_t i = 0; i < p.M; ++i) {
        for (std::int64_t j = 0; j < p.N; ++j) {
            const double c0 = p.beta == 0.0f ? 0.0 : p.c0[static_cast<std::size_t>(i * p.ldc + j)];
            double ref = p.beta * c0, mag = std::abs(ref);
            for (std::int64_t k = 0; k < p.K; ++k) {
                const double x = p.a[static_cast<std::size_t>(p.ta ? k * p.lda + i : i * p.lda + k)];
                const double y = p.b[static_cast<std::size_t>(p.tb ? j * p.ldb + k : k * p.ldb + j)];
                ref += x * y;
                mag += std::abs(x * y);
            }
            const double got = c[static_cast<std::size_t>(i * p.ldc + j)];
            const double bound = (2.0 * static_cast<double>(p.K) + 2.0) * 0x1p-24 * mag + 1e-37;
            const double r = std::abs(got - ref) / bound;
            worst = std::isnan(r) ? std::numeric_limits<double>::infinity() : std::max(worst, r);
        }
        for (std::int64_t j = p.N; j < p.ldc; ++j)
            if (!std::isnan(c[static_cast<std::size_t>(i * p.ldc + j)])) *padding_kept = false;
    }
    return worst;
}

std::vector<const KernelSet*> rows_or_skip() {
    for (Isa isa : {Isa::avx2, Isa::avx512})
        if (kernel_set_for(isa) == nullptr)
            std::printf("skipped: CPU lacks %s (%s)\n", isa_name(isa), missing_features(isa).c_str());
    return runnable_kernel_sets();
}

TEST(Gemm, RandomShapesMatchDoubleReferenceOnEveryRow) {
    std::mt19937 rng(16);
    std::uniform_int_distribution<std::int64_t> small(1, 97), deep(1, 700);
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (int trial = 0; trial < 24; ++trial) {
            const bool ta = trial & 1, tb = (trial >> 1) & 1;
            const float beta = trial % 3 == 0 ? 0.0f : trial % 3 == 1 ? 1.0f : 0.5f;
            // Every 4th trial deep enough for several K chunks on every row (KC <= 1024).
            const std::int64_t M = small(rng), N = small(rng), K = trial % 4 == 3 ? 1024 + deep(rng) : small(rng);
            const Problem p = make(ta, tb, M, N, K, beta, rng);
            bool padding_kept = false;
            const double w = worst_ratio(p, run(*row, p, 2), &padding_kept);
            EXPECT_LE(w, 1.0) << "M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb << " beta=" << beta;
            EXPECT_TRUE(padding_kept) << "a padding column of C was written";
        }
    }
}

TEST(Gemm, LargeBlocksMatchDoubleReferenceOnEveryRow) {
    // Several MC row blocks per thread and several NC column blocks (NC = 4096) with ragged
    // ends, the projection layout (B transposed), and a few rows with many columns (the
    // split over columns). 611 × 713 × 777: on a 2 MiB L2 the avx512 row's A blocks of 264 rows
    // and B blocks of 8 slivers (gemm_driver.hpp, cache_blocks) end ragged on both threads; on
    // a 1 MiB L2, 144 rows and 3 slivers.
    std::mt19937 rng(17);
    struct Shape {
        bool ta, tb;
        std::int64_t M, N, K;
    };
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (const Shape s : {Shape{false, true, 517, 203, 1101}, Shape{true, false, 13, 4133, 290}, Shape{false, false, 3, 1000, 513},
                              Shape{false, true, 611, 713, 777}}) {
            for (float beta : {0.0f, 1.0f}) {
                const Problem p = make(s.ta, s.tb, s.M, s.N, s.K, beta, rng);
                bool padding_kept = false;
                EXPECT_LE(worst_ratio(p, run(*row, p, 2), &padding_kept), 1.0) << "M=" << s.M << " N=" << s.N << " K=" << s.K;
                EXPECT_TRUE(padding_kept);
            }
        }
    }
}

TEST(Gemm, ThreadCountsBitIdenticalOnEveryRow) {
    std::mt19937 rng(18);
    struct Shape {
        std::int64_t M, N, K;
    };
    // Row split (many rows), column split (few rows), the few-row path (M <= 4); several K chunks on every row (KC <= 1024)
    // but the last.
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (const Shape s : {Shape{301, 77, 1100}, Shape{5, 999, 2100}, Shape{64, 64, 1000}, Shape{3, 999, 2100}}) {
            for (bool tb : {false, true}) {
                const Problem p = make(false, tb, s.M, s.N, s.K, 1.0f, rng);
                const std::vector<float> one = run(*row, p, 1);
                // 2 threads; 3, 6 and 8 (more than this machine's cores): grids of rows × slivers
                // (row_groups in gemm_driver.hpp, e.g. 4 × 2 for M = 301 on 8 threads).
                for (int threads : {2, 3, 6, 8}) {
                    const std::vector<float> many = run(*row, p, threads);
                    EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
                        << "M=" << s.M << " N=" << s.N << " K=" << s.K << " tb=" << tb << " threads=" << threads;
                }
            }
        }
    }
}

// 16-bit A and/or B (GemmArgs::a16/b16, the MHA layer's f16/bf16 weights and activations):
// the packing widens them exactly, so the result must be bit-identical to the float32 GEMM
// on the widened values — and within the float32 bound of the double reference on them.
// (Except bf16 A with bf16 B where the CPU has AVX-512 BF16: the pair or AMX kernel, tested next.)
// The NaN padding of A and B is kept through the rounding (NaN stays NaN).
TEST(Gemm, HalfOperandsAreWidenedExactlyOnEveryRow) {
    std::mt19937 rng(19);
    std::uniform_int_distribution<std::int64_t> small(1, 97);
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (int trial = 0; trial < 16; ++trial) {
            const GemmHalf t = trial % 2 == 0 ? GemmHalf::f16 : GemmHalf::bf16;
            const bool half_a = (trial >> 1) % 3 != 1, half_b = (trial >> 1) % 3 != 0;  // A, B, or both
            const bool ta = (trial >> 2) & 1, tb = (trial >> 3) & 1;
            const std::int64_t K = trial % 5 == 4 ? 1100 : small(rng);
            Problem p = make(ta, tb, small(rng), small(rng), K, trial % 3 == 0 ? 0.0f : 1.0f, rng);
            auto narrow = [&](std::vector<float>& v) {  // v rounded in place; its 16-bit words returned
                std::vector<std::uint16_t> h(v.size());
                for (std::size_t i = 0; i < v.size(); ++i) {
                    h[i] = t == GemmHalf::f16 ? float_to_f16(v[i]) : float_to_bf16(v[i]);
                    v[i] = t == GemmHalf::f16 ? f16_to_float(h[i]) : bf16_to_float(h[i]);
                }
                return h;
            };
            std::vector<std::uint16_t> a16, b16;
            if (half_a) a16 = narrow(p.a);
            if (half_b) b16 = narrow(p.b);
            const std::vector<float> want = run(*row, p, 2);  // float32 GEMM on the widened values
            std::vector<float> got = p.c0;
            GemmArgs g = args_of(p, got);
            // The float32 pointer of a 16-bit operand is poison: the GEMM must not read it.
            std::vector<float> nan_a(p.a.size(), kNaN), nan_b(p.b.size(), kNaN);
            g.A = half_a ? nan_a.data() : p.a.data();
            g.B = half_b ? nan_b.data() : p.b.data();
            if (half_a) {
                g.a16 = t;
                g.A16 = a16.data();
            }
            if (half_b) {
                g.b16 = t;
                g.B16 = b16.data();
            }
            sgemm(*row, g);
            const std::string what = std::string(t == GemmHalf::f16 ? "f16" : "bf16") + (half_a ? " A" : "") + (half_b ? " B" : "") +
                                     " M=" + std::to_string(p.M) + " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K) +
                                     " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
            // All-bf16 on a CPU with AVX-512 BF16 multiplies pairs of k instead (its own test below):
            // the bound, not the float32 bits.
            const bool pairs = t == GemmHalf::bf16 && half_a && half_b && row->gemm_bf16 != nullptr &&
                               cpu_features().has_avx512_bf16();
            if (!pairs) {
                EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
            }
            bool padding_kept = false;
            EXPECT_LE(worst_ratio(p, got, &padding_kept), 1.0) << what;
            EXPECT_TRUE(padding_kept) << what;
        }
    }
}

// bf16 A and B on a CPU with AVX-512 BF16: the kernel sgemm takes there (bf16_kernel below —
// AMX tiles, gemm_amx_bf16.cpp, or pairs of k, gemm_avx512_bf16.cpp) within the float32 bound
// of the double reference on the bf16 values (the products are exact), C's and the operands'
// NaN padding untouched, the same bits on 1 and 2 threads and as that kernel called directly
// (so sgemm did take it) and as the call on a PackedB's pair panels, a bias in the epilogue the
// bits of a bias-filled C with beta = 1, and a few-row call (M <= 4) the same bits as those rows
// among 40. K = 1101 gives two chunks of odd depth (551 and 550): the last pair of a chunk has
// a zero half (and on AMX a partial last step of 32 k). Tiny and odd sizes (1, 3, 17, 33, 100)
// put every edge of a 32 × 32 AMX block and of its 16-row tiles inside C.
//
// The kernel sgemm takes for bf16 A and B on this CPU (gemm.cpp): AMX tiles where it has
// AMX-BF16 — ctest's test_gemm_no_amx run hides them (ATTN_CPU_HIDE=amx_bf16), so the pair
// kernel is tested on such a CPU too — else the pair kernel.
using GemmEntry = void (*)(const GemmArgs&);
GemmEntry bf16_kernel(const KernelSet& row) {
    return row.gemm_amx != nullptr && cpu_features().has_amx_bf16() ? row.gemm_amx : row.gemm_bf16;
}

std::vector<float> run_bf16(const KernelSet& row, const Problem& p, const std::vector<std::uint16_t>& a16,
                            const std::vector<std::uint16_t>& b16, int threads, bool direct = false,
                            const PackedB* packed = nullptr, const float* bias = nullptr, std::int64_t l2 = 0) {
    std::vector<float> c = p.c0;
    GemmArgs g = args_of(p, c);
    g.l2_bytes = l2;
    if (bias != nullptr) {  // beta = 0 with the bias; C poisoned
        g.beta = 0.0f;
        g.bias = bias;
        std::fill(c.begin(), c.end(), kNaN);
    }
    g.A = nullptr;  // read A16, B16 only
    g.B = nullptr;
    g.a16 = g.b16 = GemmHalf::bf16;
    g.A16 = a16.data();
    g.B16 = b16.data();
    g.packed = packed;
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    if (direct) bf16_kernel(row)(g);
    else sgemm(row, g);
    omp_set_num_threads(before);
    return c;
}

std::vector<std::uint16_t> to_bf16_in_place(std::vector<float>& v) {  // v rounded; its bf16 words returned
    std::vector<std::uint16_t> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
        h[i] = float_to_bf16(v[i]);
        v[i] = bf16_to_float(h[i]);
    }
    return h;
}

// The A and B blocks follow the L2 size (gemm_driver.hpp, cache_blocks), which only reorders the
// tiles: with the blocks of a tiny L2 (32 KiB: MC = kMC, one sliver per B block), Zen 3's 512 KiB,
// 1 MiB, 2 MiB and a huge one (64 MiB: MC = 4·kMC or all rows, every sliver in one block), each
// row gives the bits of its call with this CPU's L2 — float32, and bfloat16 A and B (the pair or
// AMX kernel where the CPU has one) — and the float32 result is within the reference bound.
TEST(Gemm, L2SizeReordersTilesOnlyOnEveryRow) {
    std::mt19937 rng(23);
    struct Shape {
        bool ta, tb;
        std::int64_t M, N, K;
    };
    const std::int64_t l2s[] = {std::int64_t{32} << 10, std::int64_t{512} << 10, std::int64_t{1} << 20,
                                std::int64_t{2} << 20, std::int64_t{64} << 20};
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (const Shape s : {Shape{false, true, 611, 713, 777}, Shape{true, false, 517, 203, 1101}, Shape{false, true, 40, 2500, 300}}) {
            Problem p = make(s.ta, s.tb, s.M, s.N, s.K, 1.0f, rng);
            const std::string what = "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
            const std::vector<float> base = run(*row, p, 2);
            bool padding_kept = false;
            EXPECT_LE(worst_ratio(p, base, &padding_kept), 1.0) << what;
            EXPECT_TRUE(padding_kept) << what;
            for (const std::int64_t l2 : l2s)
                EXPECT_EQ(std::memcmp(base.data(), run(*row, p, 2, l2).data(), base.size() * sizeof(float)), 0)
                    << what << " l2=" << l2;
            const std::vector<std::uint16_t> a16 = to_bf16_in_place(p.a), b16 = to_bf16_in_place(p.b);
            const std::vector<float> base16 = run_bf16(*row, p, a16, b16, 2);
            for (const std::int64_t l2 : l2s)
                EXPECT_EQ(std::memcmp(base16.data(), run_bf16(*row, p, a16, b16, 2, false, nullptr, nullptr, l2).data(),
                                      base16.size() * sizeof(float)),
                          0)
                    << what << " bfloat16, l2=" << l2;
            if (HasFailure()) return;
        }
    }
}

TEST(Gemm, Bf16KernelMatchesDoubleReferenceAndIsThreadCountFree) {
    const KernelSet* row = kernel_set_for(Isa::avx512);
    if (row == nullptr || row->gemm_bf16 == nullptr || !cpu_features().has_avx512_bf16()) {
        std::printf("skipped: CPU lacks avx512_bf16\n");
        return;
    }
    if (bf16_kernel(*row) != row->gemm_amx)
        std::printf("skipped: CPU lacks amx_bf16 (or ATTN_CPU_HIDE hides it): the pair kernel is tested\n");
    else std::printf("the AMX kernel is tested (test_gemm_no_amx: the pair kernel)\n");
    std::mt19937 rng(23);
    std::uniform_int_distribution<std::int64_t> small(1, 97);
    const std::int64_t edges[] = {1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 47, 64, 100};
    std::uniform_int_distribution<std::size_t> edge(0, std::size(edges) - 1);
    for (int trial = 0; trial < 60; ++trial) {
        const bool ta = trial & 1, tb = (trial >> 1) & 1;
        const float beta = trial % 3 == 0 ? 0.0f : trial % 3 == 1 ? 1.0f : 0.5f;
        std::int64_t M = trial % 4 == 3 ? 301 : small(rng), N = trial % 5 == 4 ? 203 : small(rng);
        std::int64_t K = trial % 6 == 5 ? 1101 : small(rng);
        if (trial >= 24) {  // tiny and odd sizes, each edge of a tile and a block
            M = edges[edge(rng)];
            N = edges[edge(rng)];
            K = edges[edge(rng)];
        }
        Problem p = make(ta, tb, M, N, K, beta, rng);
        const std::vector<std::uint16_t> a16 = to_bf16_in_place(p.a), b16 = to_bf16_in_place(p.b);
        // With beta = 1 from trial 24 on: C holds a bias per column (the bias call's rule, below).
        std::vector<float> bias;
        if (trial >= 24 && beta == 1.0f) {
            std::normal_distribution<float> nd;
            for (std::int64_t j = 0; j < N; ++j) bias.push_back(nd(rng));
            for (std::int64_t i = 0; i < M; ++i)
                for (std::int64_t j = 0; j < N; ++j) p.c0[static_cast<std::size_t>(i * p.ldc + j)] = bias[static_cast<std::size_t>(j)];
        }
        const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                 " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta);
        const std::vector<float> got = run_bf16(*row, p, a16, b16, 2);
        if (!bias.empty()) {
            for (int threads : {1, 2})
                EXPECT_EQ(std::memcmp(got.data(), run_bf16(*row, p, a16, b16, threads, false, nullptr, bias.data()).data(),
                                      got.size() * sizeof(float)),
                          0)
                    << what << " bias, threads=" << threads;
        }
        bool padding_kept = false;
        EXPECT_LE(worst_ratio(p, got, &padding_kept), 1.0) << what;
        EXPECT_TRUE(padding_kept) << what;
        EXPECT_EQ(std::memcmp(got.data(), run_bf16(*row, p, a16, b16, 1).data(), got.size() * sizeof(float)), 0) << what;
        EXPECT_EQ(std::memcmp(got.data(), run_bf16(*row, p, a16, b16, 2, true).data(), got.size() * sizeof(float)), 0) << what;
        // op(B) packed once (PackedB's pair panels): the same bits, and B's words are not read
        // (NaN during the call).
        GemmArgs pg = args_of(p, p.c0);
        pg.b16 = GemmHalf::bf16;
        pg.B16 = b16.data();
        const PackedB pb = pack_b(*row, pg);
        ASSERT_NE(pb.pair_panels(), nullptr) << what;
        const std::vector<std::uint16_t> nan_b(b16.size(), 0x7FC0);
        EXPECT_EQ(std::memcmp(got.data(), run_bf16(*row, p, a16, nan_b, 2, false, &pb).data(), got.size() * sizeof(float)), 0)
            << what;
    }
    for (std::int64_t M = 1; M <= 4; ++M) {  // the few-row path: the rows of a larger call
        const bool ta = M % 2 == 0, tb = M >= 3;
        Problem big = make(ta, tb, 40, 203, 1101, 0.0f, rng);
        const std::vector<std::uint16_t> a16 = to_bf16_in_place(big.a), b16 = to_bf16_in_place(big.b);
        Problem few = big;
        few.M = M;
        few.c0.resize(static_cast<std::size_t>(M * big.ldc));
        const std::vector<float> got = run_bf16(*row, few, a16, b16, 2), all = run_bf16(*row, big, a16, b16, 2);
        bool padding_kept = false;
        EXPECT_LE(worst_ratio(few, got, &padding_kept), 1.0) << "M=" << M;
        EXPECT_TRUE(padding_kept);
        EXPECT_EQ(std::memcmp(got.data(), all.data(), got.size() * sizeof(float)), 0) << "M=" << M;
        GemmArgs pg = args_of(big, big.c0);
        pg.b16 = GemmHalf::bf16;
        pg.B16 = b16.data();
        const PackedB pb = pack_b(*row, pg);
        EXPECT_EQ(std::memcmp(got.data(), run_bf16(*row, few, a16, b16, 2, false, &pb).data(), got.size() * sizeof(float)), 0)
            << "M=" << M << " packed";
    }
}

TEST(Gemm, FewRowsMatchReferenceAndTheirRowsOfALargerCall) {
    // M <= 4 takes its own path (gemm_driver.hpp, gemm_few_rows): within the bound, C's padding
    // untouched, and bit-identical to the same rows computed among 40 (the padded path: a
    // decode step's projection gives what the prefill gives for that row). Several K chunks
    // (K > 1024) and an edge sliver (N % 32 != 0) on every row; every transpose, beta 0 and 1.
    std::mt19937 rng(19);
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (std::int64_t M = 1; M <= 4; ++M) {
            for (int variant = 0; variant < 8; ++variant) {
                const bool ta = variant & 1, tb = (variant >> 1) & 1;
                const float beta = (variant >> 2) & 1 ? 1.0f : 0.0f;
                const std::int64_t N = 203, K = 1100;
                Problem big = make(ta, tb, 40, N, K, beta, rng);
                // The same first M rows of op(A) and of C, with the big call's leading dimensions.
                Problem few = big;
                few.M = M;
                few.c0.resize(static_cast<std::size_t>(M * big.ldc));
                if (ta) {  // A is (K, M): the first M columns of each row, the rest of the row NaN
                    for (std::int64_t k = 0; k < K; ++k)
                        for (std::int64_t i = M; i < big.lda; ++i) few.a[static_cast<std::size_t>(k * big.lda + i)] = kNaN;
                } else {
                    few.a.resize(static_cast<std::size_t>(M * big.lda));
                }
                bool padding_kept = false;
                const std::vector<float> got = run(*row, few, 2), all = run(*row, big, 2);
                EXPECT_LE(worst_ratio(few, got, &padding_kept), 1.0) << "M=" << M << " ta=" << ta << " tb=" << tb;
                EXPECT_TRUE(padding_kept);
                EXPECT_EQ(std::memcmp(got.data(), all.data(), got.size() * sizeof(float)), 0)
                    << "M=" << M << " ta=" << ta << " tb=" << tb << " beta=" << beta;
                EXPECT_EQ(std::memcmp(got.data(), run(*row, few, 1).data(), got.size() * sizeof(float)), 0);
            }
        }
    }
}

// op(B) packed once (PackedB: the MHA layer's weights) gives bit-for-bit the unpacked call, on
// every row, both paths (row and column split, few rows), 1 and 2 threads, several K chunks and
// edge slivers, float32 and 16-bit B. B's own memory is NaN during the packed call, so a GEMM
// that still read B would show it; a PackedB of another row or shape is ignored (B is read).
std::vector<float> run_packed(const KernelSet& row, const Problem& p, int threads, const PackedB& pb, const float* b,
                              GemmHalf b16 = GemmHalf::none, const std::uint16_t* B16 = nullptr) {
    std::vector<float> c = p.c0;
    GemmArgs g = args_of(p, c);
    g.B = b;
    g.b16 = b16;
    g.B16 = B16;
    g.packed = &pb;
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    sgemm(row, g);
    omp_set_num_threads(before);
    return c;
}

PackedB pack_of(const KernelSet& row, const Problem& p, GemmHalf b16 = GemmHalf::none, const std::uint16_t* B16 = nullptr) {
    GemmArgs g;
    g.tb = p.tb;
    g.N = p.N;
    g.K = p.K;
    g.B = p.b.data();
    g.ldb = p.ldb;
    g.b16 = b16;
    g.B16 = B16;
    return pack_b(row, g);
}

TEST(Gemm, PackedBIsBitIdenticalToTheUnpackedCallOnEveryRow) {
    std::mt19937 rng(20);
    struct Shape {
        std::int64_t M, N, K;
    };
    const std::vector<const KernelSet*> rows = rows_or_skip();
    for (const KernelSet* row : rows) {
        SCOPED_TRACE(isa_name(row->isa));
        for (const Shape s : {Shape{301, 77, 1100}, Shape{5, 999, 1100}, Shape{64, 64, 1000}, Shape{3, 203, 1100}, Shape{1, 40, 7}}) {
            for (int variant = 0; variant < 4; ++variant) {
                const bool tb = variant & 1;
                const float beta = variant & 2 ? 1.0f : 0.0f;
                const std::string what = "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                                         " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta);
                const Problem p = make(false, tb, s.M, s.N, s.K, beta, rng);
                const std::vector<float> want = run(*row, p, 2);
                const PackedB pb = pack_of(*row, p);
                ASSERT_TRUE(pb.fits(*row, s.K, s.N)) << what;
                const std::vector<float> nan_b(p.b.size(), kNaN);
                for (int threads : {1, 2}) {
                    const std::vector<float> got = run_packed(*row, p, threads, pb, nan_b.data());
                    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what << " threads=" << threads;
                }
                // 16-bit B packs from its own dtype: the packed call equals the unpacked 16-bit call.
                const GemmHalf t = variant & 1 ? GemmHalf::bf16 : GemmHalf::f16;
                std::vector<std::uint16_t> h(p.b.size());
                for (std::size_t i = 0; i < h.size(); ++i) h[i] = t == GemmHalf::f16 ? float_to_f16(p.b[i]) : float_to_bf16(p.b[i]);
                const PackedB ph = pack_of(*row, p, t, h.data());
                std::vector<std::uint16_t> nan_h(h.size(), 0x7e00);  // a NaN in both f16 and bf16
                const std::vector<float> want16 = run_packed(*row, p, 2, PackedB{}, nan_b.data(), t, h.data());
                // (M <= 4 with a 16-bit B reads B16 itself, half the bytes of the panels: gemm.cpp.)
                const std::vector<float> got16 = run_packed(*row, p, 2, ph, nan_b.data(), t, s.M <= 4 ? h.data() : nan_h.data());
                EXPECT_EQ(std::memcmp(got16.data(), want16.data(), got16.size() * sizeof(float)), 0) << what << " 16-bit B";
                // A PackedB that does not fit (another K; another row) is ignored: B is read.
                Problem other = p;
                other.K = s.K + 1;
                other.b.assign(static_cast<std::size_t>((tb ? s.N : s.K + 1) * (p.ldb + 1)), 1.0f);
                other.ldb = p.ldb + 1;
                const PackedB wrong_k = pack_of(*row, other);
                EXPECT_FALSE(wrong_k.fits(*row, s.K, s.N));
                EXPECT_EQ(std::memcmp(run_packed(*row, p, 2, wrong_k, p.b.data()).data(), want.data(), want.size() * sizeof(float)), 0)
                    << what;
                for (const KernelSet* r2 : rows) {
                    if (r2 == row) continue;
                    const PackedB foreign = pack_of(*r2, p);
                    EXPECT_FALSE(foreign.fits(*row, s.K, s.N));
                    EXPECT_EQ(std::memcmp(run_packed(*row, p, 2, foreign, p.b.data()).data(), want.data(), want.size() * sizeof(float)), 0)
                        << what << " packed on " << isa_name(r2->isa);
                }
            }
        }
    }
}

TEST(Gemm, PackBChecksItsArguments) {
    const KernelSet& row = kernel_set();
    std::vector<float> b(12, 1.0f);
    GemmArgs g;
    g.tb = true;
    g.N = 3;
    g.K = 4;
    g.B = b.data();
    g.ldb = 3;  // narrower than Bᵀ's rows (K = 4)
    EXPECT_THROW(pack_b(row, g), Error);
    g.ldb = 4;
    g.B = nullptr;
    EXPECT_THROW(pack_b(row, g), Error);
    g.B = b.data();
    EXPECT_TRUE(pack_b(row, g).fits(row, 4, 3));
    g.K = 0;  // nothing to pack: empty (and sgemm reads no B for K = 0)
    EXPECT_TRUE(pack_b(row, g).empty());
}

// GemmArgs::bias (the projections' bias, in the epilogue of the first K chunk) against the
// path it replaces — C filled with the bias, beta = 1 — which the tests above check against the
// double reference: bit-identical on every row, with C NaN-poisoned (beta = 0 never reads it),
// for edge tiles, several K chunks, few rows (the decode path), B packed or not, 1 and 2 threads.
TEST(Gemm, BiasInTheEpilogueIsBitIdenticalToABiasFilledCOnEveryRow) {
    std::mt19937 rng(18);
    std::normal_distribution<float> nd;
    struct Shape {
        std::int64_t M, N, K;
    };
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (const Shape s : {Shape{37, 75, 61}, Shape{25, 33, 1300}, Shape{1, 70, 200}, Shape{3, 40, 2100}, Shape{300, 130, 97}}) {
            for (int variant = 0; variant < 4; ++variant) {
                const bool tb = variant & 1, packed = variant & 2;
                SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                             " tb=" + std::to_string(tb) + " packed=" + std::to_string(packed));
                Problem p = make(false, tb, s.M, s.N, s.K, 1.0f, rng);
                std::vector<float> bias(static_cast<std::size_t>(s.N));
                for (float& x : bias) x = nd(rng);
                for (std::int64_t i = 0; i < s.M; ++i)
                    for (std::int64_t j = 0; j < s.N; ++j) p.c0[static_cast<std::size_t>(i * p.ldc + j)] = bias[static_cast<std::size_t>(j)];
                const std::vector<float> filled = run(*row, p, 2);
                bool padding_kept = false;
                EXPECT_LE(worst_ratio(p, filled, &padding_kept), 1.0);
                GemmArgs g;
                g.tb = tb;
                g.M = s.M;
                g.N = s.N;
                g.K = s.K;
                g.A = p.a.data();
                g.lda = p.lda;
                g.B = p.b.data();
                g.ldb = p.ldb;
                g.bias = bias.data();
                g.ldc = p.ldc;
                const PackedB pb = packed ? pack_b(*row, g) : PackedB{};
                if (packed) g.packed = &pb;
                for (int threads : {1, 2}) {
                    std::vector<float> c(p.c0.size(), kNaN);
                    g.C = c.data();
                    const int before = omp_get_max_threads();
                    omp_set_num_threads(threads);
                    sgemm(*row, g);
                    omp_set_num_threads(before);
                    EXPECT_EQ(0, std::memcmp(c.data(), filled.data(), c.size() * sizeof(float))) << "threads=" << threads;
                }
            }
        }
        // K = 0: C is the bias (A and B are not read).
        std::vector<float> bias{1.5f, -2.0f}, c(4, kNaN);
        GemmArgs g;
        g.M = 2;
        g.N = 2;
        g.lda = 1;
        g.ldb = 2;
        g.ldc = 2;
        g.C = c.data();
        g.bias = bias.data();
        sgemm(*row, g);
        EXPECT_EQ(c, (std::vector<float>{1.5f, -2.0f, 1.5f, -2.0f}));
    }
}

// C in column blocks (GemmArgs::c_block: the MHA layer's head-major Q, K, V) changes where C is
// stored, not what: every element has the bits of the row-major call, on 1 and 2 threads,
// float32 and bfloat16 (the pair or AMX kernel where the CPU has one) operands, with a bias or
// beta = 1, pre-packed or not, K = 0 included; and nothing between or after the blocks is
// written (their padding — ldc past the block, gaps between blocks — stays NaN). Block widths:
// a multiple of NR (64: the layer's d_h), smaller than NR, and ones whose blocks start inside a
// micro-tile (48, 80, 17), whose tiles then go through the scratch tile, run by run.
TEST(Gemm, ColumnBlocksStoreTheRowMajorBitsOnEveryRow) {
    std::mt19937 rng(19);
    std::normal_distribution<float> nd;
    struct Shape {
        std::int64_t M, N, K, width;
    };
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (const Shape s : {Shape{130, 192, 300, 64}, Shape{37, 75, 61, 17}, Shape{70, 240, 1100, 48}, Shape{3, 160, 200, 80},
                              Shape{1, 64, 33, 32}, Shape{97, 128, 0, 64}, Shape{45, 200, 90, 200}}) {
            for (int variant = 0; variant < 8; ++variant) {
                const bool bias_on = variant & 1, packed = variant & 2, bf16 = variant & 4;
                SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                             " width=" + std::to_string(s.width) + " bias=" + std::to_string(bias_on) +
                             " packed=" + std::to_string(packed) + " bf16=" + std::to_string(bf16));
                Problem p = make(false, true, s.M, s.N, s.K, bias_on ? 0.0f : 1.0f, rng);
                p.lda = std::max<std::int64_t>(p.lda, 1);  // K = 0 (A and B not read) with no padding
                p.ldb = std::max<std::int64_t>(p.ldb, 1);
                std::vector<std::uint16_t> a16, b16;
                if (bf16) {
                    a16 = to_bf16_in_place(p.a);
                    b16 = to_bf16_in_place(p.b);
                }
                std::vector<float> bias(static_cast<std::size_t>(s.N));
                for (float& x : bias) x = nd(rng);
                GemmArgs g = args_of(p, p.c0);  // (C set per call below)
                if (bias_on) g.bias = bias.data();
                if (bf16) {
                    g.A = nullptr;
                    g.B = nullptr;
                    g.a16 = g.b16 = GemmHalf::bf16;
                    g.A16 = a16.data();
                    g.B16 = b16.data();
                }
                const PackedB pb = packed && s.K > 0 ? pack_b(*row, g) : PackedB{};
                if (packed) g.packed = &pb;
                // The blocked layout: ldc = width + 3, blocks 5 floats apart beyond their rows.
                const std::int64_t nb = (s.N + s.width - 1) / s.width, ldb = s.width + 3, stride = s.M * ldb + 5;
                auto at = [&](std::int64_t i, std::int64_t j) {
                    return static_cast<std::size_t>((j / s.width) * stride + i * ldb + j % s.width);
                };
                for (int threads : {1, 2}) {
                    const int before = omp_get_max_threads();
                    omp_set_num_threads(threads);
                    std::vector<float> plain = p.c0;
                    g.C = plain.data();
                    g.c_block = g.c_block_stride = 0;
                    g.ldc = p.ldc;
                    sgemm(*row, g);
                    std::vector<float> blocked(static_cast<std::size_t>(nb * stride), kNaN);
                    if (!bias_on)  // beta = 1: C's old values in their blocked places
                        for (std::int64_t i = 0; i < s.M; ++i)
                            for (std::int64_t j = 0; j < s.N; ++j) blocked[at(i, j)] = p.c0[static_cast<std::size_t>(i * p.ldc + j)];
                    g.C = blocked.data();
                    g.c_block = s.width;
                    g.c_block_stride = stride;
                    g.ldc = ldb;
                    sgemm(*row, g);
                    omp_set_num_threads(before);
                    std::int64_t differ = 0, stray = 0;
                    std::vector<char> inside(blocked.size(), 0);
                    for (std::int64_t i = 0; i < s.M; ++i)
                        for (std::int64_t j = 0; j < s.N; ++j) {
                            const float x = blocked[at(i, j)], y = plain[static_cast<std::size_t>(i * p.ldc + j)];
                            differ += std::memcmp(&x, &y, sizeof x) != 0;
                            inside[at(i, j)] = 1;
                        }
                    for (std::size_t e = 0; e < blocked.size(); ++e) stray += !inside[e] && !std::isnan(blocked[e]);
                    EXPECT_EQ(differ, 0) << "threads=" << threads;
                    EXPECT_EQ(stray, 0) << "threads=" << threads << ": written outside the blocks";
                    bool padding_kept = false;  // and the row-major call itself is right
                    if (!bf16 && !bias_on) {
                        EXPECT_LE(worst_ratio(p, plain, &padding_kept), 1.0);
                    }
                }
            }
        }
    }
}

// GemmArgs::a_group: op(A)'s rows read in groups — the MHA layer's seq-first input, row (l, b) at
// l·G + b, read as G groups of L rows (GEMM row b·L + l) — give, row for row, the bits of the
// same GEMM on a gathered copy of those rows: float32, float16 and bfloat16 A (with bfloat16 B:
// the pair or AMX kernel where the CPU has one), a bias or beta = 1, pre-packed B or not, M <= 4
// (the one-sliver path), a last group cut short (M not a multiple of L), 1 and 2 threads. A's
// padding (past K, and the rows of the groups past M) is NaN: a read there would show.
TEST(Gemm, RowGroupsOfAGiveTheGatheredRowsBitsOnEveryRow) {
    std::mt19937 rng(29);
    std::normal_distribution<float> nd;
    struct Shape {
        std::int64_t G, L, M, N, K;  // G groups of L rows, the first M GEMM rows of them
    };
    for (const KernelSet* row : rows_or_skip()) {
        SCOPED_TRACE(isa_name(row->isa));
        for (const Shape s : {Shape{4, 33, 132, 192, 300}, Shape{3, 1, 3, 75, 61}, Shape{5, 7, 33, 64, 33},
                              Shape{2, 130, 260, 130, 1100}, Shape{4, 2, 4, 96, 40}, Shape{3, 50, 150, 2304 / 8, 96}}) {
            for (int variant = 0; variant < 12; ++variant) {
                const bool bias_on = variant & 1, packed = variant & 2;
                const GemmHalf half = variant / 4 == 0 ? GemmHalf::none : variant / 4 == 1 ? GemmHalf::f16 : GemmHalf::bf16;
                SCOPED_TRACE("G=" + std::to_string(s.G) + " L=" + std::to_string(s.L) + " M=" + std::to_string(s.M) +
                             " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " bias=" + std::to_string(bias_on) +
                             " packed=" + std::to_string(packed) + " half=" + std::to_string(static_cast<int>(half)));
                Problem p = make(false, true, s.M, s.N, s.K, bias_on ? 0.0f : 1.0f, rng);
                std::vector<std::uint16_t> b16;
                if (half == GemmHalf::bf16) b16 = to_bf16_in_place(p.b);
                // The seq-first storage: GEMM row b·L + l at (l·G + b)·ld; ld = K + 3, NaN past K.
                const std::int64_t ld = s.K + 3;
                std::vector<float> seq(static_cast<std::size_t>(s.L * s.G * ld), kNaN);
                std::vector<float> gathered(static_cast<std::size_t>(s.M * ld), kNaN);
                for (std::int64_t i = 0; i < s.M; ++i)
                    for (std::int64_t k = 0; k < s.K; ++k) {
                        float x = nd(rng);
                        if (half == GemmHalf::f16) x = f16_to_float(float_to_f16(x));
                        if (half == GemmHalf::bf16) x = bf16_to_float(float_to_bf16(x));
                        seq[static_cast<std::size_t>(((i % s.L) * s.G + i / s.L) * ld + k)] = x;
                        gathered[static_cast<std::size_t>(i * ld + k)] = x;
                    }
                auto narrow = [&](const std::vector<float>& v) {
                    std::vector<std::uint16_t> h(v.size());
                    for (std::size_t e = 0; e < v.size(); ++e) h[e] = half == GemmHalf::f16 ? float_to_f16(v[e]) : float_to_bf16(v[e]);
                    return h;
                };
                const std::vector<std::uint16_t> seq16 = half == GemmHalf::none ? std::vector<std::uint16_t>{} : narrow(seq);
                const std::vector<std::uint16_t> gathered16 = half == GemmHalf::none ? std::vector<std::uint16_t>{} : narrow(gathered);
                std::vector<float> bias(static_cast<std::size_t>(s.N));
                for (float& x : bias) x = nd(rng);
                GemmArgs g = args_of(p, p.c0);
                if (bias_on) g.bias = bias.data();
                if (half == GemmHalf::bf16) {
                    g.B = nullptr;
                    g.b16 = GemmHalf::bf16;
                    g.B16 = b16.data();
                }
                g.a16 = half;
                const PackedB pb = packed ? pack_b(*row, g) : PackedB{};
                if (packed) g.packed = &pb;
                for (int threads : {1, 2}) {
                    const int before = omp_get_max_threads();
                    omp_set_num_threads(threads);
                    std::vector<float> want = p.c0, got = p.c0;
                    g.C = want.data();
                    g.lda = ld;
                    g.a_group = g.a_group_stride = 0;
                    if (half == GemmHalf::none) g.A = gathered.data();
                    else g.A16 = gathered16.data();
                    sgemm(*row, g);
                    g.C = got.data();
                    g.lda = s.G * ld;
                    g.a_group = s.L;
                    g.a_group_stride = ld;
                    if (half == GemmHalf::none) g.A = seq.data();
                    else g.A16 = seq16.data();
                    sgemm(*row, g);
                    omp_set_num_threads(before);
                    std::int64_t differ = 0, nans = 0;
                    for (std::int64_t i = 0; i < s.M; ++i)
                        for (std::int64_t j = 0; j < s.N; ++j) {
                            const auto e = static_cast<std::size_t>(i * p.ldc + j);
                            differ += std::memcmp(&want[e], &got[e], sizeof(float)) != 0;
                            nans += std::isnan(got[e]);
                        }
                    EXPECT_EQ(differ, 0) << "threads=" << threads;
                    EXPECT_EQ(nans, 0) << "threads=" << threads << ": A's NaN padding was read";
                }
            }
        }
    }
    // Row groups are rows of an untransposed A: with ta the call is refused.
    std::vector<float> a(6, 1.0f), b(6, 1.0f), c(4, kNaN);
    GemmArgs g;
    g.ta = true;
    g.M = 2;
    g.N = 2;
    g.K = 3;
    g.A = a.data();
    g.lda = 2;
    g.B = b.data();
    g.ldb = 2;
    g.C = c.data();
    g.ldc = 2;
    g.a_group = 1;
    g.a_group_stride = 6;
    EXPECT_THROW(sgemm(g), Error);
}

TEST(Gemm, RejectsABiasWithANonZeroBetaBeforeWriting) {
    std::vector<float> a(6, 1.0f), b(6, 1.0f), bias(2, 1.0f), c(4, kNaN);
    GemmArgs g;
    g.M = 2;
    g.N = 2;
    g.K = 3;
    g.A = a.data();
    g.lda = 3;
    g.B = b.data();
    g.ldb = 2;
    g.C = c.data();
    g.ldc = 2;
    g.bias = bias.data();
    g.beta = 1.0f;
    try {
        sgemm(g);
        FAIL() << "no error";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("bias: expected beta = 0"), std::string::npos) << e.what();
    }
    for (float x : c) EXPECT_TRUE(std::isnan(x));
}

TEST(Gemm, ZeroReductionScalesCWithoutReadingAOrB) {
    for (const KernelSet* row : runnable_kernel_sets()) {
        std::vector<float> c{1.0f, 2.0f, kNaN, 4.0f};
        GemmArgs g;
        g.M = 2;
        g.N = 2;
        g.lda = 1;
        g.ldb = 2;
        g.ldc = 2;
        g.C = c.data();
        sgemm(*row, g);  // beta = 0: NaN in C does not survive
        EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
        c = {1.0f, 2.0f, 3.0f, 4.0f};
        g.beta = 1.0f;
        sgemm(*row, g);
        EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4}));
    }
}

TEST(Gemm, RejectsNarrowLeadingDimensionsBeforeWriting) {
    std::vector<float> a(6, 1.0f), b(6, 1.0f), c(4, kNaN);
    GemmArgs g;
    g.M = 2;
    g.N = 2;
    g.K = 3;
    g.A = a.data();
    g.lda = 3;
    g.B = b.data();
    g.ldb = 2;
    g.C = c.data();
    g.ldc = 1;  // narrower than N = 2
    try {
        sgemm(g);
        FAIL() << "no error";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("ldc 1"), std::string::npos) << e.what();
    }
    g.ldc = 2;
    g.lda = 2;  // narrower than K = 3
    EXPECT_THROW(sgemm(g), attn::Error);
    g.lda = 3;
    g.M = -1;
    EXPECT_THROW(sgemm(g), attn::Error);
    for (float x : c) EXPECT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace attn::detail
