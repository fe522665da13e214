// Every kernel-table row's narrow16 (isa.hpp): float32 → float16 / bfloat16 with exactly the bits
// of attn/half.hpp's float_to_f16 / float_to_bf16 (whose rounding tests/unit/test_half.cpp checks
// against nearest-even in double). A sweep of the float line (every sign, exponent and rounding
// case: ties, overflow to inf, subnormal results, NaN payloads), the special values, and every
// length 0..40 at every start offset mod 16 (the vector bodies' tails), with the words past the
// end poisoned and checked untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/half.hpp"
#include "kernels/isa.hpp"

namespace attn::detail {
namespace {

float from_bits(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

std::uint16_t expected(float x, bool f16) { return f16 ? float_to_f16(x) : float_to_bf16(x); }

std::vector<float> sweep() {
    std::vector<float> x;
    // A stride prime to every power of two visits all low-bit patterns (ties, sticky bits).
    for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4093) x.push_back(from_bits(static_cast<std::uint32_t>(u)));
    const float inf = std::numeric_limits<float>::infinity();
    for (float s : {1.0f, -1.0f}) {
        for (float v : {0.0f, inf, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 5.9604645e-08f, 2.9802322e-08f,
                        2.9802326e-08f, 6.097555e-05f, 1.0009766f, 1.0004883f, 1.0014648f, 3.3895314e38f, 3.4028235e38f,
                        1.0039062f, 1.0058594f, 1.0019531f, 1e-40f, std::numeric_limits<float>::denorm_min()})
            x.push_back(s * v);
        for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0x7f80ffffu, 0x7fff0000u})
            x.push_back(from_bits(nan | (s < 0 ? 0x80000000u : 0u)));
    }
    return x;
}

TEST(Narrow16, EveryRowGivesHalfHppsBits) {
    const std::vector<float> x = sweep();
    for (const KernelSet* k : runnable_kernel_sets()) {
        for (bool f16 : {true, false}) {
            std::vector<std::uint16_t> y(x.size(), 0xdead);
            k->narrow16(x.data(), y.data(), x.size(), f16);
            std::size_t bad = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
                if (y[i] == expected(x[i], f16)) continue;
                if (++bad <= 3) {
                    std::uint32_t u;
                    std::memcpy(&u, &x[i], 4);
                    ADD_FAILURE() << isa_name(k->isa) << (f16 ? " float16" : " bfloat16") << ": x bits " << std::hex << u
                                  << " gave " << y[i] << ", half.hpp " << expected(x[i], f16);
                }
            }
            EXPECT_EQ(bad, 0u) << isa_name(k->isa) << (f16 ? " float16" : " bfloat16") << " of " << x.size() << " values";
        }
    }
}

TEST(Narrow16, TailsWriteExactlyNWords) {
    std::vector<float> x(64);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i) / 3.0f;  // inexact: rounding matters
    x[7] = std::numeric_limits<float>::quiet_NaN();  // a NaN inside a float16 vector group
    for (const KernelSet* k : runnable_kernel_sets()) {
        for (bool f16 : {true, false}) {
            for (std::size_t start = 0; start < 16; ++start) {
                for (std::size_t n = 0; n <= 40; ++n) {
                    std::vector<std::uint16_t> y(64, 0xbeef);
                    k->narrow16(x.data() + start, y.data() + start, n, f16);
                    for (std::size_t i = 0; i < y.size(); ++i) {
                        const bool inside = i >= start && i < start + n;
                        ASSERT_EQ(y[i], inside ? expected(x[i], f16) : 0xbeef)
                            << isa_name(k->isa) << (f16 ? " float16" : " bfloat16") << " start " << start << " n " << n
                            << " word " << i;
                    }
                }
            }
        }
    }
}

}  // namespace
}  // namespace attn::detail
