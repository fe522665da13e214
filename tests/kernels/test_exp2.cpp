// Every ISA's 2^x (kernels/simd/exp2.hpp), the one exp of its kernels: max relative error over a dense sweep
// of its whole range, on the portable and (when the CPU has it) the AVX2 version, and its
// special values. Bound: 2.5e-7 relative (≈ 2 ulp of float32; the fit itself is 7.9e-8
// with FMA), against std::exp2 in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu_features.hpp"
#include "kernels/isa.hpp"

namespace attn::detail {
namespace {

using Fn = void (*)(const float*, float*, std::size_t);

struct Err {
    double max_rel = 0;
    float at = 0;
    std::size_t points = 0;
};

// Every float in [lo, hi) whose bit pattern is a multiple of `step` apart, plus a uniform
// grid; relative error against double exp2.
Err sweep(Fn fn, float lo, float hi, std::uint32_t step) {
    std::vector<float> x;
    for (float f = lo; f < hi;) {
        x.push_back(f);
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        // walk the float line: towards zero for negatives, away for positives
        if (f < 0) bits = bits > step + 0x80000000u ? bits - step : 0x80000000u;
        else bits += step;
        float g;
        std::memcpy(&g, &bits, 4);
        if (g == f || (f < 0 && g == 0.0f)) {
            f = 0.0f;
            if (g == f && x.back() == 0.0f) break;
            continue;
        }
        f = g;
    }
    const int grid = 4'000'000;
    for (int i = 0; i < grid; ++i) x.push_back(lo + (hi - lo) * static_cast<float>(i) / grid);
    std::vector<float> y(x.size());
    fn(x.data(), y.data(), x.size());
    Err e;
    e.points = x.size();
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (x[i] < -126.0f) continue;
        const double want = std::exp2(static_cast<double>(x[i]));
        const double rel = std::fabs(static_cast<double>(y[i]) - want) / want;
        if (!(rel <= e.max_rel)) {
            e.max_rel = rel;
            e.at = x[i];
        }
    }
    return e;
}

// The exp2 of every kernel-table row this CPU can run: the one exp each ISA's kernels use.
std::vector<std::pair<const char*, Fn>> fns() {
    std::vector<std::pair<const char*, Fn>> v;
    for (const KernelSet* k : runnable_kernel_sets()) v.push_back({isa_name(k->isa), k->exp2});
    return v;
}

TEST(FlashExp2, MaxRelativeErrorOverRange) {
    for (auto [name, fn] : fns()) {
        // dense near 0 (the reduced argument's whole range), then the full range
        const Err a = sweep(fn, -1.0f, 1.0f, 64);
        const Err b = sweep(fn, -126.0f, 127.99f, 4096);
        const Err& w = a.max_rel > b.max_rel ? a : b;
        std::printf("exp2 %s: %zu points, max relative error %.3g (%.2f × 2^-24) at x = %.9g\n", name,
                    a.points + b.points, w.max_rel, w.max_rel * 16777216.0, static_cast<double>(w.at));
        EXPECT_LE(w.max_rel, 2.5e-7) << name << " at x = " << w.at;
    }
}

TEST(FlashExp2, SpecialValues) {
    const float inf = std::numeric_limits<float>::infinity();
    const float in[] = {0.0f, 1.0f, -1.0f, 10.0f, -126.0f, -126.5f, -127.0f, -1000.0f, -inf, 128.0f, 1000.0f, inf,
                        std::numeric_limits<float>::quiet_NaN(), 127.0f, -0.5f, 0.5f};
    const std::size_t n = sizeof(in) / sizeof(in[0]);
    for (auto [name, fn] : fns()) {
        float out[n];
        fn(in, out, n);
        EXPECT_EQ(out[0], 1.0f) << name;
        EXPECT_EQ(out[1], 2.0f) << name;
        EXPECT_EQ(out[2], 0.5f) << name;
        EXPECT_EQ(out[3], 1024.0f) << name;
        EXPECT_EQ(out[4], std::ldexp(1.0f, -126)) << name;
        EXPECT_EQ(out[5], 0.0f) << name;  // below the range: flushed to exactly 0
        EXPECT_EQ(out[6], 0.0f) << name;
        EXPECT_EQ(out[7], 0.0f) << name;
        EXPECT_EQ(out[8], 0.0f) << name;  // −inf → 0: masked scores get weight 0
        EXPECT_EQ(out[9], inf) << name;
        EXPECT_EQ(out[10], inf) << name;
        EXPECT_EQ(out[11], inf) << name;
        EXPECT_TRUE(std::isnan(out[12])) << name;
        EXPECT_EQ(out[13], std::ldexp(1.0f, 127)) << name;
        EXPECT_NEAR(out[14], 0.70710678f, 2e-7f) << name;
        EXPECT_NEAR(out[15], 1.41421356f, 3e-7f) << name;
    }
}

}  // namespace
}  // namespace attn::detail
