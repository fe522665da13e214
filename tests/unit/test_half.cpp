// attn/half.hpp: float16 / bfloat16 scalar conversions against IEEE 754 values and a
// brute-force round-to-nearest-even oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attn/half.hpp"

namespace {

using attn::bf16_to_float;
using attn::f16_to_float;
using attn::float_to_bf16;
using attn::float_to_f16;

TEST(Float16, KnownValues) {
    EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
    EXPECT_EQ(f16_to_float(0xc000), -2.0f);
    EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
    EXPECT_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));         // smallest normal
    EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));         // smallest subnormal
    EXPECT_EQ(f16_to_float(0x03ff), std::ldexp(1023.0f, -24));      // largest subnormal
    EXPECT_EQ(f16_to_float(0x7c00), std::numeric_limits<float>::infinity());
    EXPECT_EQ(f16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
    EXPECT_TRUE(std::signbit(f16_to_float(0x8000)) && f16_to_float(0x8000) == 0.0f);
}

TEST(Float16, EveryValueRoundTrips) {
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_float(static_cast<std::uint16_t>(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f)))) << std::hex << h;
        } else {
            ASSERT_EQ(float_to_f16(f), h) << std::hex << h;
        }
    }
}

TEST(Float16, RoundsToNearestEven) {
    EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);       // tie → even (down)
    EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);   // tie → even (up)
    EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
    EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);                            // tie with 65536 → inf
    EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);               // tie with 0 → 0
    EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);               // tie between 1 and 2 ulp → 2
    EXPECT_EQ(float_to_f16(-1e10f), 0xfc00);

    // Brute force: the nearest of all finite float16 values (ties to the even mantissa).
    std::vector<std::pair<double, std::uint16_t>> table;
    for (std::uint32_t h = 0; h < 0x7c00; ++h) table.emplace_back(f16_to_float(static_cast<std::uint16_t>(h)), h);
    std::mt19937 gen(5);
    std::uniform_real_distribution<double> mag(-26.0, 16.0);
    for (int n = 0; n < 200000; ++n) {
        const float f = static_cast<float>(std::exp2(mag(gen)));
        auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(static_cast<double>(f), std::uint16_t{0}));
        std::uint16_t want;
        if (it == table.end()) {
            const double top = 65504.0, next = 65536.0;  // beyond the largest: round to inf at the midpoint
            want = f >= (top + next) / 2 ? 0x7c00 : 0x7bff;
        } else if (it == table.begin() || it->first == f) {
            want = it->second;
        } else {
            const auto lo = *(it - 1), hi = *it;
            const double dl = f - lo.first, dh = hi.first - f;
            want = dl < dh ? lo.second : dh < dl ? hi.second : ((lo.second & 1) ? hi.second : lo.second);
        }
        ASSERT_EQ(float_to_f16(f), want) << f;
        ASSERT_EQ(float_to_f16(-f), want | 0x8000) << -f;
    }
}

TEST(BFloat16, KnownValuesAndRounding) {
    EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
    EXPECT_EQ(bf16_to_float(0xc010), -2.25f);
    EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie → even (down)
    EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie → even (up)
    EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
    EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
        const float f = bf16_to_float(static_cast<std::uint16_t>(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(float_to_bf16(f), h) << std::hex << h;
    }
}

}  // namespace
