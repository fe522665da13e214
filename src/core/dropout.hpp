// Dropout on attention weights, written once for every kernel (reference forward, flash
// forward, backward).
//
// The keep decision for weight (b, h, i, j) — batch, query head, query row, key column —
// is a pure function of (seed, b, h, i, j):
//     counter = (j / 4, i, h, b), key = (seed low 32 bits, seed high 32 bits)
//     r       = Philox4x32-10(counter, key)[j % 4]          (a uniform 32-bit integer)
//     keep    = r >= threshold,  threshold = round(p · 2³²)  (P(keep) = 1 − p to 2⁻³²)
// A kept weight is multiplied by scale = 1/(1 − p); a dropped one becomes exactly 0.
// One Philox call serves four consecutive keys (keep4), which is how tiled kernels use it.
// Nothing depends on the order of evaluation, so results are the same for any thread count.
#pragma once

#include <cmath>
#include <cstdint>

#include "philox.hpp"

namespace attn::detail {

struct Dropout {
    bool active = false;          // p > 0
    double p = 0.0;
    double scale = 1.0;           // 1 / (1 − p)
    std::uint32_t threshold = 0;  // keep iff r >= threshold
    PhiloxKey key{0, 0};

    Dropout() = default;
    Dropout(double p_, std::uint64_t seed) : active(p_ > 0.0), p(p_), scale(1.0 / (1.0 - p_)) {
        const double t = std::nearbyint(p_ * 4294967296.0);
        threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
        key = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
    }

    // Bit r (0..3) set iff key column 4·j4 + r of row (b, h, i) is kept.
    unsigned keep4(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j4) const {
        const PhiloxCounter r = philox4x32_10(
            {static_cast<std::uint32_t>(j4), static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(h),
             static_cast<std::uint32_t>(b)},
            key);
        return static_cast<unsigned>(r[0] >= threshold) | static_cast<unsigned>(r[1] >= threshold) << 1 |
               static_cast<unsigned>(r[2] >= threshold) << 2 | static_cast<unsigned>(r[3] >= threshold) << 3;
    }

    bool keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
        if (!active) return true;
        return (keep4(b, h, i, j >> 2) >> (j & 3)) & 1u;
    }

    // The factor weight (b, h, i, j) is multiplied by: 0 or 1/(1 − p); exactly 1 when p = 0.
    double factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
        if (!active) return 1.0;
        return keep(b, h, i, j) ? scale : 0.0;
    }
};

// What a kernel table's dropout_row fills (src/kernels/isa.hpp): the factors of 4·n4
// consecutive keys 4·j4 .. 4·j4 + 4·n4 − 1 of row (b, h, i): out[k] = keep ? scale : 0,
// keep as above (counter (j4 + t, i, h, b), key = seed words, keep iff word >= threshold).
// Plain data: it crosses into the ISA translation units.
struct DropoutRowArgs {
    std::uint32_t key0, key1, threshold;
    float scale;
    std::uint32_t b, h, i, j4;
    int n4;
    float* out;
};

}  // namespace attn::detail
