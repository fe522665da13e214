// The score tile of the flash forward: Sᵀ = scale·K·Qᵀ for one key block, then the score rule
// (scores.hpp: softcap and ALiBi over the tile, then the masks per query column).
// A part of the flash forward driver: flash_driver.hpp (which says what an Ops is) includes it
// after the definitions it uses (kLog2e, imin, the Ops traits), in each ISA file's namespace.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../../sdpa/problem.hpp"
#include "../scores.hpp"
#include "flash_operands.hpp"
#include "flash_workspace.hpp"

#ifndef ATTN_FLASH_NS
#error "include flash_driver.hpp, not flash_scores.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

// Step 1 of the score rule (scores.hpp) on the whole Sᵀ tile of keys [j0, j0+nk), row by
// row along the contiguous columns so the loops vectorise with this file's ISA: softcap
// c·tanh(s/c) (tanh_f32 over the ISA's exp2), then ALiBi −m·|d − j|. The distance is
// computed in float from abase = d − j0, exact while |d − j0| + nk <= 2^24; beyond that
// (offsets or lengths past 16 M) each column takes the int64 path of apply_alibi.
// Padding columns hold Q = 0 and are never read; they get slope 0.
// ALiBi's per-column terms of the key block starting at j0 into w.aslope (the slope; 0 for
// padding columns) and w.abase (d(column) − j0, as float). False when some distance is not
// exact in float (|d − j0| + nk > 2^24): the caller then takes apply_alibi's int64 path.
inline bool alibi_columns(const SdpaProblem& p, Workspace& w, std::int64_t b, int nq, int ncols, std::int64_t j0,
                          std::int64_t nk) {
    constexpr std::int64_t kExact = std::int64_t{1} << 24;
    const std::int64_t off = p.alibi_offset(b);
    bool exact = true;
    for (int col = 0; col < ncols; ++col) {
        const std::int64_t rel = col < nq ? w.ci[col] + off - j0 : 0;
        exact &= (rel < 0 ? -rel : rel) + nk <= kExact;
        w.aslope[col] = col < nq ? p.alibi_slope(b, w.ch[col]) : 0.0f;
        w.abase[col] = static_cast<float>(rel);
    }
    return exact;
}

inline void tile_modifiers(const SdpaProblem& p, Workspace& w, std::int64_t b, int nq, int ncols, std::int64_t j0,
                           std::int64_t nk, int ldS, bool with_alibi = true) {
    if (p.softcap > 0.0) {
        const float c = static_cast<float>(p.softcap), inv_c = static_cast<float>(1.0 / p.softcap);
        for (std::int64_t j = 0; j < nk; ++j) {  // ncols is a multiple of 16: whole vectors
            float* sj = w.s + j * ldS;
            for (int col = 0; col < ncols; col += kTanhLanes) {
                vfloat v;
                std::memcpy(&v, sj + col, sizeof v);
                v = tanh_vec(v * inv_c) * c;
                std::memcpy(sj + col, &v, sizeof v);
            }
        }
    }
    if (!p.alibi_slopes || !with_alibi) return;
    if (alibi_columns(p, w, b, nq, ncols, j0, nk)) {
        for (std::int64_t j = 0; j < nk; ++j) {
            float* sj = w.s + j * ldS;
            const float jf = static_cast<float>(j);
            for (int col = 0; col < ncols; ++col) {
                sj[col] -= w.aslope[col] * std::fabs(w.abase[col] - jf);  // fabs: a branch would not vectorise
            }
        }
    } else {
        for (int col = 0; col < nq; ++col) apply_alibi(p, b, w.ch[col], w.ci[col], j0, nk, w.s + col, ldS);
    }
}

// The mask rule's step on the ranges alone (apply_mask_rule's last: a key outside a column's
// [lo, hi) → −inf), for a block with no element-wise mask: key row by key row along the
// contiguous columns, so the loop vectorises (compares of 8 int64 ranges, masked stores of 16
// scores). The same −inf entries as the rule column by column, whose strided stores (64 calls of
// up to 64 stores on a causal diagonal block) took ≈ a tenth of that block (kernels-lab fwd-31).
inline void mask_key_ranges(Workspace& w, int nq, std::int64_t j0, std::int64_t nk, int ldS) {
    const std::int64_t* lo = w.lo;
    const std::int64_t* hi = w.hi;
    for (std::int64_t j = 0; j < nk; ++j) {
        float* sj = w.s + j * ldS;
        const std::int64_t key = j0 + j;
        for (int c = 0; c < nq; ++c) sj[c] = (key < lo[c]) | (key >= hi[c]) ? kNegInf : sj[c];
    }
}

// The mask rule on the block's columns: masks given element-wise column by column (with the
// ranges, apply_mask_rule), else the ranges alone row by row (mask_key_ranges).
inline void mask_columns(const SdpaProblem& p, Workspace& w, std::int64_t b, int nq, std::int64_t j0,
                         std::int64_t nk, int ldS) {
    if (!p.has_elementwise_mask()) {
        mask_key_ranges(w, nq, j0, nk, ldS);
        return;
    }
    for (int c = 0; c < nq; ++c)
        apply_mask_rule(p, b, w.ch[c], w.ci[c], j0, nk, w.s + c, ldS, KeyRange{w.lo[c], w.hi[c]});
}

// Keys [0, n) of the block [j0, j0+nk) that some column of panel pn can see, n = panel_keys(…):
// keys from n on lie past every column's visible end (w.hi), so where the mask rule runs on the
// ranges (ranges_partial, the masked stage) it leaves them −inf in the whole panel and their
// weights are exactly 0. The products skip them: score_tile does not compute their scores and
// pv_tile does not add their 0·V (x + 0·v = x: Oᵀ is never −0; a V entry that is not finite
// meets P on the selecting path, finite.hpp, which adds nothing where P is 0) — the same bits.
// On a causal diagonal block (Mb = Nb = 64, top-left) the first 32-query panel sees the first
// half of the keys: a quarter of the block's FLOPs (kernels-lab fwd-26). A panel with a padding
// column (c ≥ nq: the mask rule leaves its rows alone) takes every key.
template <class Ops>
inline std::int64_t panel_keys(const Workspace& w, int nq, int pn, std::int64_t j0, std::int64_t nk) {
    const int c0 = pn * Ops::kPanel;
    if (c0 + Ops::kPanel > nq) return nk;
    std::int64_t end = 0;
    for (int c = c0; c < c0 + Ops::kPanel; ++c) end = imax(end, w.hi[c] - j0);
    return imin(end, nk);
}

// A panel pair's qk rows (keys) when panel pn needs keys [0, n0) and pn + 1 keys [0, n1):
// both(r, rows) in calls of `step` rows from 0 over the keys both need (the last call may run past
// min(n0, n1) into keys the mask hides: whole calls) — or, both_at_once, one call both(0, rows)
// over all of them (a micro-kernel that tiles a block itself) — then one(q, r, rows) — q = 0 or
// 1, `each` rows a call — over the rest of each panel's own keys. n0 = n1 = nk: the pair alone.
template <class Both, class One>
inline void pair_key_rows(std::int64_t nk, std::int64_t n0, std::int64_t n1, int step, int each, Both&& both, One&& one,
                          bool both_at_once = false) {
    const std::int64_t common = imin(nk, (imin(n0, n1) + step - 1) / step * step);
    if (both_at_once) {
        if (common > 0) both(0, static_cast<int>(common));
    } else {
        for (std::int64_t r = 0; r < common; r += step) both(r, static_cast<int>(imin(step, nk - r)));
    }
    const std::int64_t ends[2] = {n0, n1};
    for (int q = 0; q < 2; ++q)
        for (std::int64_t r = common; r < ends[q]; r += each) one(q, r, static_cast<int>(imin(each, ends[q] - r)));
}

// Sᵀ (scaled, modified, masked) of keys [j0, j0+nk) against all panels of the block.
// `stage` < masked (the scores output): stop after the scale or after the softcap.
// shared: the key block's K rows as a group read them once (run_group), else null.
// as_stored: key_block's (Ops::qk_block's hook; the score rule then leaves Sᵀ as stored).
template <class Ops>
void score_tile(const SdpaProblem& p, Workspace& w, std::int64_t b, std::int64_t hk, int nq, int panels, std::int64_t j0, std::int64_t nk, int ldS, float scale,
                bool ranges_partial, ScoreStage stage = ScoreStage::masked, const KvTile* shared = nullptr,
                bool as_stored = false, float* speculative = nullptr) {
    if constexpr (kOpsOwnOperands<Ops>) {
        Ops::qk_block(p, w, b, hk, panels, j0, nk, ldS, scale, as_stored);
    } else {
    std::int64_t ldk = shared != nullptr ? shared->ldk : 0;
    const float* kp = shared != nullptr ? shared->k : kv_tile_rows<Ops>(p, false, b, hk, j0, nk, p.Dk, w.kbuf, ldk, panels);
    const int Dk = static_cast<int>(p.Dk);
    // Keys of panel pn the products compute (panel_keys): all but past the columns' ends.
    const bool skip_hidden = ranges_partial && stage == ScoreStage::masked;
    auto keys_of = [&](int pn) { return skip_hidden ? panel_keys<Ops>(w, nq, pn, j0, nk) : nk; };
    if constexpr (kOpsFuseModifiers<Ops>) {
        // Softcap and ALiBi in the micro-kernel's store (see QkModifiers), when that is the
        // whole of step 1 and ALiBi's distances are exact in float; masks follow below as usual.
        if (stage == ScoreStage::masked && p.has_score_modifiers() &&
            (!p.alibi_slopes || alibi_columns(p, w, b, nq, panels * Ops::kPanel, j0, nk))) {
            QkModifiers m;
            if (p.softcap > 0.0) {
                m.cap = static_cast<float>(p.softcap);
                m.inv_cap = static_cast<float>(1.0 / p.softcap);
            }
            for (int pn = 0; pn < panels;) {
                const float* qt = w.qt + static_cast<std::int64_t>(pn) * Dk * Ops::kPanel;
                if (p.alibi_slopes) {
                    m.slope = w.aslope + pn * Ops::kPanel;
                    m.rel = w.abase + pn * Ops::kPanel;
                }
                if constexpr (kOpsPanelPairs<Ops>) {
                    if (pn + 2 <= panels) {  // two panels a call (kOpsPanelPairs)
                        pair_key_rows(
                            nk, keys_of(pn), keys_of(pn + 1), Ops::kPairRows, Ops::kRows,
                            [&](std::int64_t r, int rows) {
                                Ops::qk_modified_pair(qt, kp + r * ldk, ldk, rows, Dk, scale,
                                                      w.s + r * ldS + pn * Ops::kPanel, ldS, m, static_cast<float>(r));
                            },
                            [&](int q, std::int64_t r, int rows) {  // one panel: its own slope/rel columns
                                QkModifiers mq = m;
                                if (p.alibi_slopes) {
                                    mq.slope += q * Ops::kPanel;
                                    mq.rel += q * Ops::kPanel;
                                }
                                Ops::qk_modified(qt + static_cast<std::int64_t>(q) * Dk * Ops::kPanel, kp + r * ldk, ldk,
                                                 rows, Dk, scale, w.s + r * ldS + (pn + q) * Ops::kPanel, ldS, mq,
                                                 static_cast<float>(r));
                            });
                        pn += 2;
                        continue;
                    }
                }
                const std::int64_t n = keys_of(pn);
                for (std::int64_t r = 0; r < n; r += Ops::kRows)
                    Ops::qk_modified(qt, kp + r * ldk, ldk, static_cast<int>(imin(Ops::kRows, n - r)), Dk, scale,
                                     w.s + r * ldS + pn * Ops::kPanel, ldS, m, static_cast<float>(r));
                ++pn;
            }
            if (ranges_partial || p.has_elementwise_mask()) mask_columns(p, w, b, nq, j0, nk, ldS);
            return;
        }
    }
    for (int pn = 0; pn < panels;) {
        const float* qt = w.qt + static_cast<std::int64_t>(pn) * Dk * Ops::kPanel;
        // One panel's rows [r, r + rows) (Ops::qk), its column maxima started over at its first row.
        auto one = [&](int q, std::int64_t r, int rows) {
            float* sr = w.s + r * ldS + (pn + q) * Ops::kPanel;
            const float* qq = qt + static_cast<std::int64_t>(q) * Dk * Ops::kPanel;
            if constexpr (kOpsColumnMax<Ops>)
                Ops::qk(qq, kp + r * ldk, ldk, rows, Dk, scale, sr, ldS, w.colmax + (pn + q) * Ops::kPanel, r == 0);
            else Ops::qk(qq, kp + r * ldk, ldk, rows, Dk, scale, sr, ldS);
        };
        if constexpr (kOpsPanelPairs<Ops>) {
            if (pn + 2 <= panels) {  // two panels a call (kOpsPanelPairs)
                // The keys both panels see in one call (kOpsPanelPairs; all nk unless the block
                // hides some: pair_key_rows, then each panel's own keys past those one at a time);
                // the softmax in its store in a speculative block (kOpsSpeculate, one pair; such a
                // block hides no key), the column maxima (kOpsColumnMax).
                float* cmax = nullptr;
                if constexpr (kOpsColumnMax<Ops>) cmax = w.colmax + pn * Ops::kPanel;
                pair_key_rows(
                    nk, keys_of(pn), keys_of(pn + 1), Ops::kPairRows, Ops::kRows,
                    [&](std::int64_t, int rows) {
                        if constexpr (kOpsSpeculate<Ops>)
                            Ops::qk_pair(qt, kp, ldk, rows, Dk, scale, w.s + pn * Ops::kPanel, ldS, cmax, speculative,
                                         w.kv_next);
                        else Ops::qk_pair(qt, kp, ldk, rows, Dk, scale, w.s + pn * Ops::kPanel, ldS, cmax, nullptr,
                                          w.kv_next);
                    },
                    one, /*both_at_once=*/true);
                pn += 2;
                continue;
            }
        }
        const std::int64_t n = keys_of(pn);
        for (std::int64_t r = 0; r < n; r += Ops::kRows) one(0, r, static_cast<int>(imin(Ops::kRows, n - r)));
        ++pn;
    }
    }
    // The score rule: the modifiers on the whole tile, then the masks on each query's
    // column — skipped for a tile every query sees completely when no mask is element-wise.
    if (stage == ScoreStage::scaled || speculative != nullptr) return;
    if (stage == ScoreStage::softcapped) {
        if (p.softcap > 0.0) tile_modifiers(p, w, b, nq, panels * Ops::kPanel, j0, nk, ldS, false);
        return;
    }
    if (p.has_score_modifiers()) tile_modifiers(p, w, b, nq, panels * Ops::kPanel, j0, nk, ldS);
    if (ranges_partial || p.has_elementwise_mask()) mask_columns(p, w, b, nq, j0, nk, ldS);
    // Padding columns (c >= nq) keep whatever they hold: their Q is 0 and no output reads them.
}

}  // namespace attn::detail::ATTN_FLASH_NS
