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
                        for (std::int64_t r = 0; r < nk; r += Ops::kPairRows)
                            Ops::qk_modified_pair(qt, kp + r * ldk, ldk, static_cast<int>(imin(Ops::kPairRows, nk - r)), Dk,
                                                  scale, w.s + r * ldS + pn * Ops::kPanel, ldS, m, static_cast<float>(r));
                        pn += 2;
                        continue;
                    }
                }
                for (std::int64_t r = 0; r < nk; r += Ops::kRows)
                    Ops::qk_modified(qt, kp + r * ldk, ldk, static_cast<int>(imin(Ops::kRows, nk - r)), Dk, scale,
                                     w.s + r * ldS + pn * Ops::kPanel, ldS, m, static_cast<float>(r));
                ++pn;
            }
            if (ranges_partial || p.has_elementwise_mask())
                for (int c = 0; c < nq; ++c)
                    apply_mask_rule(p, b, w.ch[c], w.ci[c], j0, nk, w.s + c, ldS, KeyRange{w.lo[c], w.hi[c]});
            return;
        }
    }
    for (int pn = 0; pn < panels;) {
        const float* qt = w.qt + static_cast<std::int64_t>(pn) * Dk * Ops::kPanel;
        if constexpr (kOpsPanelPairs<Ops>) {
            if (pn + 2 <= panels) {  // two panels a call (kOpsPanelPairs)
                // All nk key rows in one call (kOpsPanelPairs); the softmax in its store in a
                // speculative block (kOpsSpeculate, one pair), the column maxima (kOpsColumnMax).
                float* cmax = nullptr;
                if constexpr (kOpsColumnMax<Ops>) cmax = w.colmax + pn * Ops::kPanel;
                if constexpr (kOpsSpeculate<Ops>)
                    Ops::qk_pair(qt, kp, ldk, static_cast<int>(nk), Dk, scale, w.s + pn * Ops::kPanel, ldS, cmax, speculative);
                else Ops::qk_pair(qt, kp, ldk, static_cast<int>(nk), Dk, scale, w.s + pn * Ops::kPanel, ldS, cmax);
                pn += 2;
                continue;
            }
        }
        for (std::int64_t r = 0; r < nk; r += Ops::kRows) {
            const int rows = static_cast<int>(imin(Ops::kRows, nk - r));
            float* sr = w.s + r * ldS + pn * Ops::kPanel;
            if constexpr (kOpsColumnMax<Ops>)
                Ops::qk(qt, kp + r * ldk, ldk, rows, Dk, scale, sr, ldS, w.colmax + pn * Ops::kPanel, r == 0);
            else Ops::qk(qt, kp + r * ldk, ldk, rows, Dk, scale, sr, ldS);
        }
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
    if (ranges_partial || p.has_elementwise_mask())
        for (int c = 0; c < nq; ++c)
            apply_mask_rule(p, b, w.ch[c], w.ci[c], j0, nk, w.s + c, ldS, KeyRange{w.lo[c], w.hi[c]});
    // Padding columns (c >= nq) keep whatever they hold: their Q is 0 and no output reads them.
}

}  // namespace attn::detail::ATTN_FLASH_NS
