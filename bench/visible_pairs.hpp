// The visible (query, key) pairs of a call, over its batch and query heads: what `attn bench` and
// the labs count FLOPs by (bench/shapes.md: 2·(Dk + Dv) per pair in the forward — Q·Kᵀ and A·V —,
// 2.5× that in the backward). Counted row by row with the library's own visible interval
// (SdpaProblem::key_range: causal of either alignment, the window, key lengths), so neither the
// benchmark nor the labs restate the mask rules. "Causal counts half" holds for no shape exactly:
// with Lq = Lk = L a causal mask leaves L(L+1)/2 pairs per head; with Lq < Lk top-left leaves
// Lq(Lq+1)/2 and bottom-right Lq(Lq+1)/2 + Lq(Lk − Lq); with Lq > Lk the top-left rows past Lk see
// every key and the first Lq − Lk bottom-right rows none. Element-wise masks (bool, additive) are
// not counted: no benchmark shape or lab uses them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attn/sdpa.hpp"
#include "sdpa/problem.hpp"

namespace attn::bench {

// p: any problem the library built (make_problem), or one with only its sizes and masks set.
inline double visible_pairs(const attn::detail::SdpaProblem& p) {
    double pairs = 0;
    for (std::int64_t b = 0; b < p.B; ++b)
        for (std::int64_t i = 0; i < p.Lq; ++i) {
            const attn::detail::KeyRange r = p.key_range(b, i);
            pairs += static_cast<double>(std::max<std::int64_t>(0, r.hi - r.lo));
        }
    return pairs * static_cast<double>(p.Hq);
}

// A benchmark shape's: B sequences alike (no key lengths), so one is counted and multiplied.
inline double visible_pairs(std::int64_t B, std::int64_t Hq, std::int64_t Lq, std::int64_t Lk, Causal causal) {
    attn::detail::SdpaProblem one;
    one.B = 1;
    one.Hq = Hq;
    one.Lq = Lq;
    one.Lk = Lk;
    one.causal = causal;
    return static_cast<double>(B) * visible_pairs(one);
}

}  // namespace attn::bench
