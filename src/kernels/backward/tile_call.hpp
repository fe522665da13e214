// One tile's call of the kernel table's tile (run_tile): the tile classified by the structural
// masks, its TileArgs from the task's buffers, the score-rule callback (tile_score_rule) and the
// dropout factors; tile_sees, the same test for a pass's keys.
// A part of the backward driver: only flash_backward.cpp includes it, and like the rest of the
// driver it has internal linkage (anonymous namespace).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../scores.hpp"
#include "backward_scratch.hpp"
#include "tile.hpp"

#ifndef ATTN_BACKWARD_DRIVER
#error "include tile_call.hpp from flash_backward.cpp only"
#endif

namespace attn::detail {
namespace {

// What the score-rule callback of a partial tile needs: the tile's place in the problem.
struct RuleContext {
    const SdpaProblem* p;
    std::int64_t b, h, i0, j0;
    int bc, bcp;
    const std::int64_t* lo;  // visible key interval of row i0 + row: [lo[row], hi[row])
    const std::int64_t* hi;
    float* softcap_grad;  // (br, bcp) or null
};

// TileArgs::score_rule: S·scale, then the score rule, then −inf on the padded keys. With a
// softcap the tile has scaled and capped the row already (tile.hpp): ALiBi and masks only.
void tile_score_rule(const void* ctx, int row, float* s) {
    const RuleContext& c = *static_cast<const RuleContext*>(ctx);
    const SdpaProblem& p = *c.p;
    const std::int64_t i = c.i0 + row;
    float* g = c.softcap_grad ? c.softcap_grad + static_cast<std::ptrdiff_t>(row) * c.bcp : nullptr;
    if (p.softcap > 0.0) {
        if (p.alibi_slopes) apply_alibi(p, c.b, c.h, i, c.j0, c.bc, s, 1);
        apply_mask_rule(p, c.b, c.h, i, c.j0, c.bc, s, 1, KeyRange{c.lo[row], c.hi[row]});
    } else {
        const float scale = static_cast<float>(p.scale);
        for (int j = 0; j < c.bc; ++j) s[j] *= scale;
        apply_score_rule(p, c.b, c.h, i, c.j0, c.bc, s, 1, KeyRange{c.lo[row], c.hi[row]});
    }
    for (int j = c.bc; j < c.bcp; ++j) s[j] = kNegInf;
    if (g)  // a masked key gets no gradient, even where its score was NaN (select, not 0·NaN)
        for (int j = 0; j < c.bcp; ++j)
            if (s[j] == kNegInf) g[j] = 0.0f;
}

// One tile: query rows [i0, i0 + kBr) of head h (g-th of the group) against the packed key
// block [j0, j0 + bc). dQ goes to the caller's rows, the task's own rows or chunk dq_c's partials.
void run_tile(const Plan& c, Scratch& s, KeyBlock& kb, std::int64_t b, std::int64_t h, std::size_t g,
              std::int64_t i0, float* dq_c, RowsAhead* ahead) {
    const SdpaProblem& p = c.p;
    const std::int64_t j0 = kb.j0;
    const int bc = kb.bc, bcp = kb.bcp;
    const std::int64_t Lq = c.Lq;
    const int br = static_cast<int>(std::min<std::int64_t>(kBr, Lq - i0));
    // Classify the tile by the structural masks: hidden, fully visible, or partial.
    // (the softcap is the tile's own step, not the callback's)
    bool any = false, full = !(p.has_elementwise_mask() || p.alibi_slopes);
    for (int i = 0; i < br; ++i) {
        const std::int64_t l = c.lo[static_cast<std::size_t>(b * Lq + i0 + i)];
        const std::int64_t u = c.hi[static_cast<std::size_t>(b * Lq + i0 + i)];
        any |= std::max(l, j0) < std::min(u, j0 + bc);
        full &= l <= j0 && u >= j0 + bc;
    }
    if (!any) return;
    TileArgs t;
    t.br = br;
    t.bc = bc;
    t.bcp = bcp;
    t.Dk = static_cast<int>(c.Dk);
    t.Dv = static_cast<int>(c.Dv);
    t.Dkp = c.Dkp;
    t.Dvp = c.Dvp;
    t.q = s.q.at[g] + i0 * s.q.ld[g];
    t.ldq = s.q.ld[g];
    t.q_dk = s.q.z_at[g] + i0 * s.q.z_ld[g];
    t.ldq_dk = s.q.z_ld[g];
    t.dO = s.dO.at[g] + i0 * s.dO.ld[g];
    t.ldo = s.dO.ld[g];
    t.dO_dv = s.dO.z_at[g] + i0 * s.dO.z_ld[g];
    t.ldo_dv = s.dO.z_ld[g];
    t.dO_nonfinite = s.dO.nonfinite[g] != 0;
    t.kt = kb.kt.data();
    t.vt = kb.vt.data();
    t.kp = kb.kp.data();
    t.neg_lse = s.nl.data() + g * static_cast<std::size_t>(Lq) + i0;
    t.Drow = s.dd.data() + g * static_cast<std::size_t>(Lq) + i0;
    t.scale = c.scale;
    t.ds_scale = c.split.ds;
    t.S = s.S.data();
    t.dP = s.dP.data();
    t.Pd = s.Pd.data();
    t.dq = c.dq_own ? own_dq_row(c, s, b, h, g, i0)
                    : dq_c + static_cast<std::size_t>((b * c.Hq + h) * Lq + i0) * static_cast<std::size_t>(c.Dkp);
    t.lddq = c.dq_direct ? c.bp.dq.stride(2) : c.Dkp;
    t.dk = kb.dk.data();
    t.dv = kb.dv.data();
    t.dkv_first = kb.unwritten;
    t.ahead = ahead->per_block > 0 ? ahead : nullptr;
    char* dq_unwritten = c.dq_own ? &s.dq_unwritten[g * query_tiles(Lq) + static_cast<std::size_t>(i0 / kBr)] : nullptr;
    t.dq_first = dq_unwritten && *dq_unwritten;
    float* cg = p.softcap > 0.0 ? s.cg.data() : nullptr;
    const RuleContext rule{&p, b, h, i0, j0, bc, bcp, c.lo.data() + b * Lq + i0, c.hi.data() + b * Lq + i0, cg};
    if (!full) {
        t.score_rule = tile_score_rule;
        t.rule_ctx = &rule;
    }
    if (cg) {
        t.softcap = static_cast<float>(p.softcap);
        t.softcap_inv = static_cast<float>(1.0 / p.softcap);
        t.softcap_grad = cg;
    }
    if (c.drop.active) {
        // Z/(1−p) for every (row, key) of the tile. The call's origin may put key
        // j0 anywhere in a Philox block, so each row is filled whole blocks at a
        // time into drow and the tile's bcp factors copied out.
        for (int i = 0; i < br; ++i) {
            const float* f = c.drop.fill_row(c.kernels.dropout_row, b, h, i0 + i, j0, bcp, s.drow.data());
            std::copy_n(f, bcp, s.drop.data() + static_cast<std::ptrdiff_t>(i) * bcp);
        }
        t.drop = s.drop.data();
    }
    TileBf16 z;
    if (c.bf16) {
        z.q = s.q.at16[g] + i0 * s.q.ld16[g];
        z.ldq = s.q.ld16[g];
        z.dO = s.dO.at16[g] + i0 * s.dO.ld16[g];
        z.ldo = s.dO.ld16[g];
        z.q_pairs = s.q.pairs.data() + g * static_cast<std::size_t>(c.Lq2 * c.Dkp) + static_cast<std::size_t>(i0 / 2 * c.Dkp);
        z.dO_pairs = s.dO.pairs.data() + g * static_cast<std::size_t>(c.Lq2 * c.Dvp) + static_cast<std::size_t>(i0 / 2 * c.Dvp);
        z.kt_pairs = kb.ktp.data();
        z.vt_pairs = kb.vtp.data();
        z.k_pairs = kb.kpp.data();
        z.p_pairs = s.pp.data();
        z.ds_rows = s.ds16.data();
        t.bf16 = &z;
    }
    c.tile(t);
    kb.unwritten = false;
    if (dq_unwritten) *dq_unwritten = 0;
}

// Whether query rows [i0, i0 + kBr) of batch b see any key in [j0, j1) by the structural masks
// (run_tile's test for one key block, here for a pass's).
bool tile_sees(const Plan& c, std::int64_t b, std::int64_t i0, std::int64_t j0, std::int64_t j1) {
    const std::int64_t i1 = std::min<std::int64_t>(c.Lq, i0 + kBr);
    for (std::int64_t i = i0; i < i1; ++i) {
        const std::size_t r = static_cast<std::size_t>(b * c.Lq + i);
        if (std::max(c.lo[r], j0) < std::min(c.hi[r], j1)) return true;
    }
    return false;
}

}  // namespace
}  // namespace attn::detail
