// The MHA layer's GEMM (src/mha/linear.cpp): right against a double reference for every
// transpose, and bit-identical on 1 and 2 threads — by construction: threads split C, never K
// (src/gemm/gemm.hpp; tests/gemm/test_gemm.cpp tests the GEMM itself on every ISA row).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mha/linear.hpp"

namespace {

using attn::detail::gemm;

struct Operands {
    std::int64_t M, N, K, lda, ldb, ldc;
    std::vector<float> a, b, c0;  // c0: C before the call (its padding columns are poison)
};

Operands make(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, std::mt19937& rng) {
    std::normal_distribution<float> n;
    Operands o{M, N, K, (ta ? M : K) + 3, (tb ? K : N) + 5, N + 2, {}, {}, {}};
    o.a.resize(static_cast<std::size_t>((ta ? K : M) * o.lda));
    o.b.resize(static_cast<std::size_t>((tb ? N : K) * o.ldb));
    o.c0.resize(static_cast<std::size_t>(M * o.ldc));
    for (auto* v : {&o.a, &o.b, &o.c0})
        for (float& x : *v) x = n(rng);
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = N; j < o.ldc; ++j) o.c0[static_cast<std::size_t>(i * o.ldc + j)] = std::numeric_limits<float>::quiet_NaN();
    return o;
}

std::vector<float> run(bool ta, bool tb, const Operands& o, float beta, int threads) {
    std::vector<float> c = o.c0;
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    gemm(ta, tb, o.M, o.N, o.K, o.a.data(), o.lda, o.b.data(), o.ldb, beta, c.data(), o.ldc);
    omp_set_num_threads(before);
    return c;
}

TEST(MhaGemm, MatchesDoubleReferenceAndThreadCount) {
    std::mt19937 rng(3);
    // 1100 × 1030: no micro-tile size divides either (edge tiles); K = 1 and 37 (odd).
    const std::int64_t M = 1100, N = 1030;
    for (std::int64_t K : {1, 37}) {
        for (bool ta : {false, true}) {
            for (bool tb : {false, true}) {
                const Operands o = make(ta, tb, M, N, K, rng);
                for (float beta : {0.0f, 1.0f}) {
                    const std::vector<float> one = run(ta, tb, o, beta, 1), two = run(ta, tb, o, beta, 2);
                    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0)
                        << "ta=" << ta << " tb=" << tb << " K=" << K << " beta=" << beta;
                    double worst = 0.0;
                    for (std::int64_t i = 0; i < M; ++i) {
                        for (std::int64_t j = 0; j < N; ++j) {
                            double ref = beta * o.c0[static_cast<std::size_t>(i * o.ldc + j)], mag = std::abs(ref);
                            for (std::int64_t k = 0; k < K; ++k) {
                                const double x = o.a[static_cast<std::size_t>(ta ? k * o.lda + i : i * o.lda + k)];
                                const double y = o.b[static_cast<std::size_t>(tb ? j * o.ldb + k : k * o.ldb + j)];
                                ref += x * y;
                                mag += std::abs(x * y);
                            }
                            // fp32 accumulation of K + 1 terms: |error| <= (K + 1)·eps·Σ|terms|.
                            const double err = std::abs(one[static_cast<std::size_t>(i * o.ldc + j)] - ref);
                            worst = std::max(worst, err / ((K + 1) * 0x1p-23 * mag + 1e-30));
                        }
                        for (std::int64_t j = N; j < o.ldc; ++j)
                            ASSERT_TRUE(std::isnan(one[static_cast<std::size_t>(i * o.ldc + j)])) << "padding written";
                    }
                    EXPECT_LE(worst, 1.0) << "ta=" << ta << " tb=" << tb << " K=" << K << " beta=" << beta;
                }
            }
        }
    }
}

TEST(MhaGemm, ZeroReductionScalesC) {
    std::vector<float> c{1.0f, 2.0f, 3.0f, 4.0f};
    gemm(false, true, 2, 2, 0, nullptr, 1, nullptr, 1, 0.0f, c.data(), 2);
    EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
    c = {1.0f, 2.0f, 3.0f, 4.0f};
    gemm(false, true, 2, 2, 0, nullptr, 1, nullptr, 1, 1.0f, c.data(), 2);
    EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
