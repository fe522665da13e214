// Dropout on attention weights, written once for every kernel (reference forward, flash
// forward, backward).
//
// The keep decision for weight (b, h, i, j) — batch, query head, query row, key column of the
// whole problem — is a pure function of (seed, b, h, i, j):
//     counter = (j / 4, i, h, b), key = (seed low 32 bits, seed high 32 bits)
//     r       = Philox4x32-10(counter, key)[j % 4]          (a uniform 32-bit integer)
//     keep    = r >= threshold,  threshold = round(p · 2³²)  (P(keep) = 1 − p to 2⁻³²)
// A kept weight is multiplied by scale = 1/(1 − p); a dropped one becomes exactly 0.
// One Philox call serves four consecutive keys (keep4), which is how tiled kernels use it.
// Nothing depends on the order of evaluation, so results are the same for any thread count.
//
// A call may be one piece of a larger problem (a ring block, SdpaOptions::dropout_origin):
// its element (b, h, i, j) is then (origin.batch + b, origin.head + h, origin.row + i,
// origin.key + j) of the whole, and keep/factor/fill_row take the call's own indices.
#pragma once

#include <cmath>
#include <cstdint>

#include "philox.hpp"

namespace attn::detail {

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

struct Dropout {
    bool active = false;          // p > 0
    double p = 0.0;
    double scale = 1.0;           // 1 / (1 − p)
    std::uint32_t threshold = 0;  // keep iff r >= threshold
    PhiloxKey key{0, 0};
    // Where the call's (0, 0, 0, 0) sits in the whole problem (SdpaOptions::dropout_origin).
    std::int64_t batch0 = 0, head0 = 0, row0 = 0, key0 = 0;

    Dropout() = default;
    Dropout(double p_, std::uint64_t seed, std::int64_t batch0_ = 0, std::int64_t head0_ = 0, std::int64_t row0_ = 0,
            std::int64_t key0_ = 0)
        : active(p_ > 0.0), p(p_), scale(1.0 / (1.0 - p_)), batch0(batch0_), head0(head0_), row0(row0_), key0(key0_) {
        const double t = std::nearbyint(p_ * 4294967296.0);
        threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
        key = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
    }

    // Bit r (0..3) set iff key column 4·j4 + r of row (b, h, i) is kept — indices of the WHOLE
    // problem (no origin added).
    unsigned keep4(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j4) const {
        const PhiloxCounter r = philox4x32_10(
            {static_cast<std::uint32_t>(j4), static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(h),
             static_cast<std::uint32_t>(b)},
            key);
        return static_cast<unsigned>(r[0] >= threshold) | static_cast<unsigned>(r[1] >= threshold) << 1 |
               static_cast<unsigned>(r[2] >= threshold) << 2 | static_cast<unsigned>(r[3] >= threshold) << 3;
    }

    // The call's weight (b, h, i, j) (origin added).
    bool keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
        if (!active) return true;
        const std::int64_t g = key0 + j;
        return (keep4(batch0 + b, head0 + h, row0 + i, g >> 2) >> (g & 3)) & 1u;
    }

    // The factor the call's weight (b, h, i, j) is multiplied by: 0 or 1/(1 − p); exactly 1 when p = 0.
    double factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
        if (!active) return 1.0;
        return keep(b, h, i, j) ? scale : 0.0;
    }

    // The factors of the call's keys j .. j + n − 1 of row (b, h, i), filled by a kernel table's
    // dropout_row (`fill`, whole Philox blocks) into buf, which must hold n + 6 floats: returns
    // where key j's factor is (buf + (key0 + j) % 4). The one place a tiled kernel adds the origin.
    template <class Fill>
    const float* fill_row(Fill fill, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t n,
                          float* buf) const {
        const std::int64_t g = key0 + j, j4 = g >> 2, off = g & 3;
        const DropoutRowArgs a{key[0], key[1], threshold, static_cast<float>(scale),
                               static_cast<std::uint32_t>(batch0 + b), static_cast<std::uint32_t>(head0 + h),
                               static_cast<std::uint32_t>(row0 + i), static_cast<std::uint32_t>(j4),
                               static_cast<int>((off + n + 3) >> 2), buf};
        fill(a);
        return buf + off;
    }
};

}  // namespace attn::detail
