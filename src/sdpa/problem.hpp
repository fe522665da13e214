// SdpaProblem — the one params struct every kernel receives: validated views (masks
// already broadcast to (B, Hq, Lq, Lk) with stride-0 dims), resolved scale, sizes, and
// the mask rules written once (docs/conventions.md has the pictures).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "attn/sdpa.hpp"

namespace attn::detail {

// Half-open interval of key indices [lo, hi) that the structural masks (causal,
// window, key lengths) leave visible to one query. Every structural mask is an
// interval, so their intersection is one too; kernels use it to skip whole tiles.
struct KeyRange {
    std::int64_t lo = 0;
    std::int64_t hi = 0;
    bool empty() const { return hi <= lo; }
};

struct SdpaProblem {
    TensorView q, k, v, out;
    std::optional<TensorView> lse, weights;
    std::optional<TensorView> bool_mask;      // broadcast to (B, Hq, Lq, Lk)
    std::optional<TensorView> additive_mask;  // broadcast to (B, Hq, Lq, Lk)
    std::optional<TensorView> key_lengths;    // (B,)
    std::int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, Dk = 0, Dv = 0;
    std::int64_t group = 1;  // Hq / Hkv: query heads per KV head
    double scale = 1.0;
    Causal causal = Causal::none;
    Window window{};
    double dropout_p = 0.0;         // 0 ≤ p < 1; 0 = no dropout (src/core/dropout.hpp)
    std::uint64_t dropout_seed = 0;

    // GQA head map: query head h reads KV head h / group (consecutive query heads share).
    std::int64_t kv_head(std::int64_t h) const { return h / group; }

    std::int64_t key_length(std::int64_t b) const {
        if (!key_lengths) return Lk;
        return static_cast<std::int64_t>(key_lengths->load_as_double(key_lengths->offset(b)));
    }

    // Diagonal of query i for an alignment: top-left → i, bottom-right → i + Lk − Lq.
    std::int64_t diagonal(Align a, std::int64_t i) const {
        return a == Align::top_left ? i : i + Lk - Lq;
    }

    KeyRange key_range(std::int64_t b, std::int64_t i) const {
        KeyRange r{0, std::min(Lk, key_length(b))};
        if (causal != Causal::none) {
            const Align a = causal == Causal::top_left ? Align::top_left : Align::bottom_right;
            r.hi = std::min(r.hi, diagonal(a, i) + 1);
        }
        if (window.active()) {
            const std::int64_t d = diagonal(window.align, i);
            if (window.left >= 0) r.lo = std::max(r.lo, d - window.left);
            if (window.right >= 0) r.hi = std::min(r.hi, d + window.right + 1);
        }
        return r;
    }

    bool has_elementwise_mask() const { return bool_mask.has_value() || additive_mask.has_value(); }
};

// Checks every argument (throws attn::Error naming it) and builds the problem.
SdpaProblem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                         const SdpaOptions& options, const TensorView& out, const TensorView* lse,
                         const TensorView* weights);

}  // namespace attn::detail
