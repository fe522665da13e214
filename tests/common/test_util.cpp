// The shared test helpers: compare must catch what it claims to catch and name the worst
// element; the poison must survive every float dtype and differ from any NaN arithmetic makes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/util.hpp"

namespace attn::test {
namespace {

Tensor filled(const Shape& s, std::initializer_list<double> values) {
    Tensor t(DType::f32, s);
    std::int64_t i = 0;
    for (double x : values) store(t, i++, x);
    return t;
}

TEST(TestUtil, CompareCountsBadElementsAndNamesTheWorst) {
    const Tensor want = filled(Shape{2, 3}, {1, 2, 3, 4, 5, -INFINITY});
    // Tolerance 0.1 + 0.1·|want|: element [0, 1] is 0.25 off (bound 0.3, fine), [1, 0] 1.0 off (bound 0.5),
    // [1, 1] 0.7 off (bound 0.6).
    const Tensor got = filled(Shape{2, 3}, {1, 2.25, 3, 5, 5.7, -INFINITY});
    const Diff d = compare(got, want, 0.1, 0.1);
    EXPECT_EQ(d.n, 6);
    EXPECT_EQ(d.bad, 2);
    EXPECT_EQ(d.at, 3);
    EXPECT_DOUBLE_EQ(d.worst_ratio, 1.0 / 0.5);
    EXPECT_NEAR(d.max_abs, 1.0, 1e-6);
    EXPECT_EQ(d.message(),
              "2 of 6 elements beyond atol 0.1 + rtol 0.1·|want|; worst [1, 0]: got 5, want 4, error 1 = 2 × tolerance");
    EXPECT_FALSE(all_close(got, want, 0.1, 0.1));
    EXPECT_TRUE(all_close(got, want, 0.1, 0.3));
}

TEST(TestUtil, CompareRejectsNaNMismatchedInfinityAndShape) {
    const Tensor want = filled(Shape{3}, {1, INFINITY, 0});
    EXPECT_EQ(compare(filled(Shape{3}, {NAN, INFINITY, 0}), want, 1, 1).bad, 1);
    EXPECT_EQ(compare(filled(Shape{3}, {1, 1e30, 0}), want, 1, 1).bad, 1);
    EXPECT_EQ(compare(filled(Shape{3}, {1, -INFINITY, 0}), want, 1, 1).bad, 1);
    EXPECT_EQ(compare(filled(Shape{3}, {1, INFINITY, 1e-30}), want, 0, 0).bad, 1);  // zero tolerance
    EXPECT_EQ(compare(filled(Shape{1, 3}, {1, INFINITY, 0}), want, 1, 1).bad, 3);
    EXPECT_EQ(compare(filled(Shape{3}, {1, INFINITY, 0}), want, 0, 0).bad, 0);
}

TEST(TestUtil, CompareReadsStridedViewsOfAnyFloatDtype) {
    std::mt19937 rng(1);
    const Tensor a = randn(DType::f64, Shape{2, 3, 4}, rng);
    const Tensor a16 = to_storage(a, DType::bf16);
    EXPECT_TRUE(all_close(a16, a, 0, unit_roundoff(DType::bf16)));
    EXPECT_FALSE(all_close(a16, a, 0, unit_roundoff(DType::bf16) / 4));
    const TensorView t = a.view().transpose(0, 2);
    const Tensor tc = to_storage(t, DType::f64);  // contiguous copy of the transposed view
    EXPECT_EQ(compare(tc, t, 0, 0).bad, 0);
    EXPECT_EQ(at(tc, 3, 1, 0), at(a, 0, 1, 3));
}

TEST(TestUtil, PoisonIsOneNaNInEveryFloatDtypeAndNotOneArithmeticMakes) {
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
        const Tensor t = poisoned(dt, Shape{2, 5});
        EXPECT_TRUE(still_poisoned(t)) << dtype_name(dt);
        EXPECT_TRUE(is_poison(at(t, 1, 4)) && std::isnan(at(t, 1, 4))) << dtype_name(dt);
        store(t, 7, 0.5);
        EXPECT_FALSE(still_poisoned(t)) << dtype_name(dt);
        EXPECT_EQ(compare(t, t, 1, 1).bad, 9) << dtype_name(dt);  // a poisoned element never compares equal
    }
    volatile double zero = 0.0, inf = INFINITY;
    EXPECT_TRUE(written_nan(zero / zero));
    EXPECT_TRUE(written_nan(inf - inf));
    EXPECT_TRUE(written_nan(std::numeric_limits<double>::quiet_NaN()));
    EXPECT_TRUE(written_nan(static_cast<double>(std::numeric_limits<float>::quiet_NaN())));
    EXPECT_FALSE(written_nan(poison_value()));
    EXPECT_FALSE(written_nan(1.0));
}

TEST(TestUtil, PoisonLeavesBytesOutsideAStridedViewAlone) {
    Tensor big(DType::f32, Shape{3, 4});
    for (std::int64_t i = 0; i < 12; ++i) big.data_as<float>()[i] = 1.0f;
    poison(big.view().slice(1, 1, 2));  // columns 1 and 2
    for (std::int64_t r = 0; r < 3; ++r)
        for (std::int64_t c = 0; c < 4; ++c) EXPECT_EQ(is_poison(at(big, r, c)), c == 1 || c == 2) << r << "," << c;
}

TEST(TestUtil, RandomTensorsAreSeededAndHaveTheirDistribution) {
    std::mt19937_64 r1(5), r2(5);
    const Tensor a = randn(DType::f32, Shape{100, 100}, r1, 2.0, 3.0), b = randn(DType::f32, Shape{100, 100}, r2, 2.0, 3.0);
    EXPECT_EQ(compare(a, b, 0, 0).bad, 0);
    double sum = 0, sq = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) sum += at(a, i / 100, i % 100), sq += std::pow(at(a, i / 100, i % 100) - 3.0, 2);
    EXPECT_NEAR(sum / 1e4, 3.0, 0.1);             // 5 standard errors of the mean
    EXPECT_NEAR(std::sqrt(sq / 1e4), 2.0, 0.1);   // ≈ 7 standard errors of the sd
    std::mt19937 r3(9);
    const Tensor u = rand_uniform(DType::f16, Shape{1000}, r3, -2.0, -1.0);
    double lo = 0, hi = -3;
    for (std::int64_t i = 0; i < 1000; ++i) lo = std::min(lo, at(u, i)), hi = std::max(hi, at(u, i));
    EXPECT_GE(lo, -2.0);
    EXPECT_LE(hi, -1.0);
    EXPECT_LT(lo, -1.9);
    EXPECT_GT(hi, -1.1);
    const Tensor m = random_bool(Shape{1000}, r3, 0.25);
    int ones = 0;
    for (std::int64_t i = 0; i < 1000; ++i) ones += m.data_as<std::uint8_t>()[i];
    EXPECT_NEAR(ones, 250, 70);  // 5 standard deviations (√(1000·0.25·0.75) ≈ 13.7)
}

}  // namespace
}  // namespace attn::test
