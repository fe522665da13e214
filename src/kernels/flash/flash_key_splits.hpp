// Key splits (flash_key_chunk: few tasks on many cores): run_chunk, merge_partials, merge_block.
// A part of the flash forward driver: flash_driver.hpp (which says what an Ops is) includes it
// after the per-task code it uses (run_block and its steps), in each ISA file's namespace.
#pragma once

#include <cmath>
#include <cstring>

#ifndef ATTN_FLASH_NS
#error "include flash_driver.hpp, not flash_key_splits.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

// A split task runs as one item per key chunk [c0, c1), each leaving its partial — the
// columns' (m, l) without the sink and their unnormalised Oᵀ — in a slot of its own; after
// every item, merge_block combines a task's slots in chunk order (the order is fixed, so the
// result does not depend on the threads) and stores the outputs as run_block does:
//   m = max(σ, mᶜ),  l = e^{σ−m} + Σᶜ e^{mᶜ−m}·lᶜ,  Oᵀ = Σᶜ e^{mᶜ−m}·Oᵀᶜ        (σ: the sink, if any)
// Non-finite values follow run_block's rules chunk by chunk: a chunk whose Oᵀ ends non-finite
// is computed again on the careful path (its large part, bigot, is merged the same way and
// folded in at the store), and a NaN/±inf score or V entry reaches the merged (m, l, Oᵀ)
// through the same arithmetic as in one pass (NaN stays NaN, e^{−inf} = 0). One case is the
// merge's own: an element of Oᵀ that overflows only in the sum of finite partials. Its row is
// computed again whole (run_block, O only; lse, weights and scores come from the merged
// (m, l), which V cannot change) — rare, so the common path stays simple.
// Slot layout (slot_floats): m (Mb), l (Mb), Oᵀ (Dv × Mb), bigot (Dv × Mb, careful chunks
// only), then the careful flag.
inline std::int64_t slot_floats(const SdpaProblem& p, const FlashTiles& t) { return (2 * p.Dv + 2) * t.Mb + 16; }

template <class Ops>
void run_chunk(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, const TaskAt& a,
               std::int64_t c0, std::int64_t c1, float* slot) {
    const BlockCols k = block_columns<Ops>(p, w, a);
    const std::int64_t lo = imax(k.ulo, c0), hi = imin(k.uhi, c1), acc = p.Dv * t.Mb;
    float* careful_flag = slot + 2 * t.Mb + 2 * acc;
    if (lo >= hi) {  // no visible key in the chunk: an empty partial (m = −inf), Oᵀ not written
        for (int c = 0; c < k.nq; ++c) {
            slot[c] = kNegInf;
            slot[t.Mb + c] = 0.0f;
        }
        *careful_flag = 0.0f;
        return;
    }
    pack_block_q<Ops>(p, w, a.b, k);
    accumulate_keys<Ops>(p, t, drop, w, a.b, a.hk, k.nq, k.panels, lo, hi, false, a.kv_ahead, false);
    const bool careful = any_nonfinite(w.ot, t.Mb, p.Dv, k.nq);  // as in run_block
    if (careful) accumulate_keys<Ops>(p, t, drop, w, a.b, a.hk, k.nq, k.panels, lo, hi, true, a.kv_ahead, false);
    std::memcpy(slot, w.m, sizeof(float) * static_cast<std::size_t>(k.nq));
    std::memcpy(slot + t.Mb, w.l, sizeof(float) * static_cast<std::size_t>(k.nq));
    std::memcpy(slot + 2 * t.Mb, w.ot, sizeof(float) * static_cast<std::size_t>(acc));
    if (careful) std::memcpy(slot + 2 * t.Mb + acc, w.bigot, sizeof(float) * static_cast<std::size_t>(acc));
    *careful_flag = careful ? 1.0f : 0.0f;
}

// The merged (m, l, Oᵀ, and bigot when a chunk was careful) of a task's chunks into the
// workspace; returns whether a chunk was careful. overflow[q]: an element of row q's Oᵀ is not
// finite although every term of its sum is (see above).
inline bool merge_partials(const SdpaProblem& p, const FlashTiles& t, Workspace& w, const BlockCols& k,
                           const float* slots, std::int64_t chunks, unsigned char* overflow) {
    const std::int64_t sf = slot_floats(p, t), acc = p.Dv * t.Mb;
    const int ldO = t.Mb;
    bool careful = false;
    for (std::int64_t c = 0; c < chunks; ++c) careful = careful || slots[c * sf + 2 * t.Mb + 2 * acc] != 0.0f;
    start_rows(p, w, k.nq, k.nq, true);
    for (std::int64_t c = 0; c < chunks; ++c)  // the merged max (fmax: a NaN m reaches l below)
        for (int q = 0; q < k.nq; ++q) w.m[q] = std::fmax(w.m[q], slots[c * sf + q]);
    for (int q = 0; q < k.nq; ++q)  // the sink's share (l = 1 at m = σ), or 0
        w.l[q] = p.sinks ? std::exp(p.sink(w.ch[q]) - w.m[q]) : 0.0f;
    std::memset(w.ot, 0, sizeof(float) * static_cast<std::size_t>(acc));
    if (careful) std::memset(w.bigot, 0, sizeof(float) * static_cast<std::size_t>(acc));
    for (std::int64_t c = 0; c < chunks; ++c) {
        const float* mc = slots + c * sf;
        const float* lc = mc + t.Mb;
        const float* oc = mc + 2 * t.Mb;
        const bool big = mc[2 * t.Mb + 2 * acc] != 0.0f;
        // α: this chunk's rescale, 0 where it saw nothing. A chunk that saw keys is added even
        // when α underflows to 0: 0·NaN keeps a visible NaN/±inf of V, as in one pass.
        bool any = false;
        for (int q = 0; q < k.nq; ++q) {
            w.alpha[q] = mc[q] == kNegInf ? 0.0f : std::exp(mc[q] - w.m[q]);
            w.l[q] += w.alpha[q] * lc[q];
            any = any || mc[q] != kNegInf;
        }
        if (!any) continue;  // an empty partial: its Oᵀ was not even written
        for (std::int64_t d = 0; d < p.Dv; ++d)
            for (int q = 0; q < k.nq; ++q) {
                if (mc[q] == kNegInf) continue;
                w.ot[d * ldO + q] += w.alpha[q] * oc[d * ldO + q];
                if (big) w.bigot[d * ldO + q] += w.alpha[q] * oc[acc + d * ldO + q];
            }
    }
    for (int q = 0; q < k.nq; ++q) {
        overflow[q] = 0;
        if (!std::isfinite(w.l[q])) continue;  // NaN statistics: the row is NaN, as in one pass
        for (std::int64_t d = 0; d < p.Dv && !overflow[q]; ++d) {
            const std::int64_t e = d * ldO + q;
            if (!nonfinite_f32(w.ot[e]) && !(careful && nonfinite_f32(w.bigot[e]))) continue;
            bool terms_finite = true;  // of the chunks that add to it
            for (std::int64_t c = 0; c < chunks && terms_finite; ++c) {
                const float* mc = slots + c * sf;
                if (mc[q] == kNegInf) continue;
                const bool big = mc[2 * t.Mb + 2 * acc] != 0.0f;
                terms_finite = !nonfinite_f32(mc[2 * t.Mb + e]) && !(big && nonfinite_f32(mc[2 * t.Mb + acc + e]));
            }
            overflow[q] = terms_finite ? 1 : 0;
        }
    }
    return careful;
}

template <class Ops>
void merge_block(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, const TaskAt& a,
                 const float* slots, std::int64_t chunks) {
    const BlockCols k = block_columns<Ops>(p, w, a);
    unsigned char overflow[4096];  // Mb ≤ 4096 (flash.cpp)
    bool careful = merge_partials(p, t, w, k, slots, chunks, overflow);
    // Rows whose merge overflowed: O from run_block, everything else from the merge.
    unsigned char merged[4096], again[4096];
    bool any_again = false;
    for (int q = 0; q < k.nq; ++q) {
        merged[q] = overflow[q] ? kStoreStats : kStoreOut | kStoreStats;
        again[q] = overflow[q] ? kStoreOut : 0;
        any_again = any_again || overflow[q];
    }
    if (any_again) {
        run_block<Ops>(p, t, drop, w, a, again);
        // run_block used the workspace: merge again (cheap next to the chunks; the same
        // operations give the same bits) rather than saving and restoring the merged state.
        careful = merge_partials(p, t, w, k, slots, chunks, overflow);
    }
    if (p.weights || p.scores) pack_block_q<Ops>(p, w, a.b, k);
    finish_block<Ops>(p, t, drop, w, a.b, a.hk, k, careful, any_again ? merged : nullptr);
}

}  // namespace attn::detail::ATTN_FLASH_NS
