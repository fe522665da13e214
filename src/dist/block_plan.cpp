// The ring's blocks as sdpa calls (block_plan.hpp explains the band).
#include "block_plan.hpp"

#include <algorithm>
#include <cstdlib>

#include "../core/check.hpp"

namespace attn::dist::detail {

std::vector<Band> global_bands(const attn::detail::SdpaProblem& g, bool alibi) {
    std::vector<Band> bands(static_cast<std::size_t>(g.B));
    for (std::int64_t b = 0; b < g.B; ++b) {
        Band& band = bands[static_cast<std::size_t>(b)];
        band.keys = std::min(g.Lk, g.key_length(b));
        if (alibi) band.alibi = g.alibi_offset(b);
        if (g.causal != Causal::none) {
            const Align a = g.causal == Causal::top_left ? Align::top_left : Align::bottom_right;
            band.hi = g.diagonal_offset(a, b);
        }
        if (g.window.active()) {
            const std::int64_t d = g.diagonal_offset(g.window.align, b);
            // A side wider than any |j − i| (< Lq + Lk) excludes nothing: leave it unbounded, so
            // that d ± side never nears the int64 limits (|d| <= 2^60 + Lq + Lk).
            const std::int64_t reach = g.Lq + g.Lk + std::abs(d);
            if (g.window.left >= 0 && g.window.left <= reach) band.lo = d - g.window.left;
            if (g.window.right >= 0 && g.window.right <= reach) {
                band.hi = std::min(band.hi.value_or(d + g.window.right), d + g.window.right);
            }
        }
    }
    return bands;
}

namespace {

// Sequence b in one block, in the block's local indices (query a, key c): it sees c iff
// 0 <= c < keys, lo <= c − a <= hi, for rows [row_lo, row_hi).
struct Local {
    bool visible = false;
    std::int64_t keys = 0, lo = 0, hi = 0, row_lo = 0, row_hi = 0;
};

Local localise(const Band& band, const Segment& qs, const Segment& ks) {
    const std::int64_t R = qs.length, K = ks.length, s = qs.start - ks.start;
    Local l;
    l.keys = std::clamp<std::int64_t>(band.keys - ks.start, 0, K);
    // Clamp unbounded and far sides to the block: c − a lies in [−(R − 1), K − 1], so −R and K
    // exclude nothing. Every value stays within [−R, K], far from the limits of a query_offset.
    l.lo = band.lo ? std::max(*band.lo + s, -R) : -R;
    l.hi = band.hi ? std::min(*band.hi + s, K) : K;
    // Row a sees a key iff max(0, a + lo) <= min(keys − 1, a + hi).
    l.row_lo = std::max<std::int64_t>(0, -l.hi);
    l.row_hi = std::min(R, l.keys - l.lo);
    l.visible = l.keys > 0 && l.lo <= l.hi && l.row_lo < l.row_hi;
    return l;
}

// Visible (row, key) pairs of one sequence in rows [row0, row0 + rows), keys from key0.
std::int64_t count_visible(const Local& l, std::int64_t row0, std::int64_t rows) {
    std::int64_t n = 0;
    for (std::int64_t a = row0; a < row0 + rows; ++a) {
        const std::int64_t first = std::max<std::int64_t>(0, a + l.lo), last = std::min(l.keys - 1, a + l.hi);
        n += std::max<std::int64_t>(0, last - first + 1);
    }
    return n;
}

}  // namespace

std::vector<BlockCall> plan_block(const std::vector<Band>& bands, const Segment& qs, const Segment& ks) {
    const std::int64_t B = static_cast<std::int64_t>(bands.size());
    if (B == 0 || qs.length == 0 || ks.length == 0) return {};
    std::vector<Local> loc(static_cast<std::size_t>(B));
    // The union of what any sequence sees: rows [r0, r1), keys [k0, k1).
    std::int64_t r0 = qs.length, r1 = 0, k0 = ks.length, k1 = 0;
    bool any = false, uniform = true;
    std::int64_t width = 0;
    // A side bounded for some sequences only (a window wider than the others' reach) is, for
    // the others, clamped to the block by localise: one encoding serves all of them.
    bool upper = false, lower = false;
    for (const Band& band : bands) {
        upper |= band.hi.has_value();
        lower |= band.lo.has_value();
    }
    // ALiBi: a window (left, right) around the edge E_b nearest the ALiBi diagonal (BlockCall).
    const bool alibi = bands.front().alibi.has_value();
    std::vector<std::int64_t> edge(static_cast<std::size_t>(B), 0), shift(static_cast<std::size_t>(B), 0);
    std::int64_t a_left = -1, a_right = -1;
    for (std::int64_t b = 0; b < B; ++b) {
        const Local l = localise(bands[static_cast<std::size_t>(b)], qs, ks);
        loc[static_cast<std::size_t>(b)] = l;
        if (!l.visible) continue;
        r0 = std::min(r0, l.row_lo);
        r1 = std::max(r1, l.row_hi);
        k0 = std::min(k0, std::max<std::int64_t>(0, l.row_lo + l.lo));
        k1 = std::max(k1, std::min(l.keys, l.row_hi - 1 + l.hi + 1));
        // One call serves every sequence when the band's width (the window's left side relative to
        // the upper diagonal) is the same for all of them.
        if (upper && lower && any && l.hi - l.lo != width) uniform = false;
        width = l.hi - l.lo;
        if (alibi) {
            // The diagonal in block coordinates: key − query = A_b + s, s = qs.start − ks.start.
            const std::int64_t A = *bands[static_cast<std::size_t>(b)].alibi + (qs.start - ks.start);
            const std::int64_t E = std::clamp(A, l.lo, l.hi);
            edge[static_cast<std::size_t>(b)] = E;
            shift[static_cast<std::size_t>(b)] = std::abs(A - E);
            if (any && (E - l.lo != a_left || l.hi - E != a_right)) uniform = false;
            a_left = E - l.lo;
            a_right = l.hi - E;
        }
        any = true;
    }
    if (!any) return {};

    auto make_call = [&](std::int64_t b0, std::int64_t nb) {
        BlockCall c;
        c.b0 = b0;
        c.nb = nb;
        c.row0 = r0;
        c.rows = r1 - r0;
        c.key0 = k0;
        c.keys = k1 - k0;
        c.global_row0 = qs.start + r0;
        c.global_key0 = ks.start + k0;
        for (std::int64_t b = b0; b < b0 + nb; ++b) {
            const Local& l = loc[static_cast<std::size_t>(b)];
            const std::int64_t n = l.visible ? std::clamp<std::int64_t>(l.keys - k0, 0, c.keys) : 0;
            c.key_lengths.push_back(n);
            c.has_key_lengths |= n < c.keys;
            // Local query a' = a − r0, key c' = c − k0: c − a <= hi  ⇔  c' − a' <= hi + r0 − k0.
            c.offset.push_back((upper ? l.hi : l.lo) + r0 - k0);
            if (l.visible) c.visible += count_visible(l, r0, c.rows);
            if (upper && lower && l.visible) c.window_left = l.hi - l.lo;
        }
        if (upper) c.causal = Causal::top_left;
        if (!upper && lower) c.window_left = 0;  // only a lower side: the diagonal is lo itself
        c.has_offset = upper || lower;
        if (alibi) {
            // The band as a window around E_b (sides clamped to the block: finite, >= 0).
            c.causal = Causal::none;
            c.window_left = a_left;
            c.window_right = a_right;
            c.has_offset = true;
            for (std::int64_t b = b0; b < b0 + nb; ++b) {
                const bool vis = loc[static_cast<std::size_t>(b)].visible;
                c.offset[static_cast<std::size_t>(b - b0)] = vis ? edge[static_cast<std::size_t>(b)] + r0 - k0 : 0;
                c.alibi_shift.push_back(vis ? shift[static_cast<std::size_t>(b)] : 0);
            }
            if (nb == 1) {  // one sequence: its own sides
                const Local& l = loc[static_cast<std::size_t>(b0)];
                c.window_left = edge[static_cast<std::size_t>(b0)] - l.lo;
                c.window_right = l.hi - edge[static_cast<std::size_t>(b0)];
            }
        }
        return c;
    };
    if (uniform) return {make_call(0, B)};
    std::vector<BlockCall> calls;
    for (std::int64_t b = 0; b < B; ++b)
        if (loc[static_cast<std::size_t>(b)].visible) calls.push_back(make_call(b, 1));
    return calls;
}

std::vector<BlockCall> split_rows(const BlockCall& c, std::int64_t max_rows) {
    if (c.rows <= max_rows) return {c};
    std::vector<BlockCall> pieces;
    for (std::int64_t a0 = 0; a0 < c.rows; a0 += max_rows) {
        BlockCall p = c;
        p.row0 = c.row0 + a0;
        p.rows = std::min(max_rows, c.rows - a0);
        p.global_row0 = c.global_row0 + a0;
        // The piece's query a'' is the call's a0 + a'': d(a'') = a0 + a'' + offset.
        for (std::int64_t& o : p.offset) o += a0;
        p.visible = a0 == 0 ? c.visible : 0;
        pieces.push_back(std::move(p));
    }
    return pieces;
}

}  // namespace attn::dist::detail
