// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// a counter-based RNG — the output is a pure function of a 128-bit counter and a 64-bit
// key, so any element of a random stream can be computed on its own, in any order, by
// any thread. Checked against the Random123 known-answer vectors (tests/grad).
#pragma once

#include <array>
#include <cstdint>

namespace attn::detail {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;  // round multipliers
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;  // key schedule (golden ratio, sqrt(3)-1)
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;

// One round: two 32×32→64 multiplies, the high halves mixed with the other words and the key.
inline PhiloxCounter philox_round(const PhiloxCounter& c, const PhiloxKey& k) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kPhiloxM0) * c[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kPhiloxM1) * c[2];
    return {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
            static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
}

// Ten rounds, the key bumped by (W0, W1) between rounds.
inline PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k[0] += kPhiloxW0;
            k[1] += kPhiloxW1;
        }
        c = philox_round(c, k);
    }
    return c;
}

}  // namespace attn::detail
