// The visible (query, key) pairs of a call, over its batch and query heads: what the labs count
// FLOPs by (bench/shapes.md: 4·D per pair in the forward — Q·Kᵀ and A·V —, 2.5× that in the
// backward). Counted row by row with the library's own visible interval (SdpaProblem::key_range:
// causal of either alignment, the window, key lengths), so the labs never restate the mask rules.
// "Causal counts half" holds for Lq = Lk only: with Lq < Lk a top-left causal mask leaves
// Lq(Lq+1)/2 pairs per head and a bottom-right one Lq(Lq+1)/2 + Lq(Lk − Lq); with Lq > Lk the
// top-left rows past Lk see every key. Element-wise masks (bool, additive) are not counted: no
// lab uses them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "sdpa/problem.hpp"

namespace lab {

inline double visible_pairs(const attn::detail::SdpaProblem& p) {
    double pairs = 0;
    for (std::int64_t b = 0; b < p.B; ++b)
        for (std::int64_t i = 0; i < p.Lq; ++i) {
            const attn::detail::KeyRange r = p.key_range(b, i);
            pairs += static_cast<double>(std::max<std::int64_t>(0, r.hi - r.lo));
        }
    return pairs * static_cast<double>(p.Hq);
}

}  // namespace lab
