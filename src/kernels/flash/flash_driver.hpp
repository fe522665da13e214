// The flash forward driver: tiling, the score rule, online softmax, output. Included by
// one .cpp per ISA (flash_portable.cpp, flash_avx2.cpp, flash_avx512.cpp), each of which first defines
// ATTN_FLASH_NS (a namespace of its own, so the compilations never share a symbol)
// and a struct of micro-kernels `Ops` (see the signatures in run_flash below; Ops::dropout_row
// fills the dropout factors of a row segment, see src/core/dropout.hpp; Ops::widen(src,
// stride, n, is_f16, dst) converts n float16/bfloat16 values at an element stride to float32).
//
// Its parts, one concept each: flash_workspace.hpp (the per-thread scratch), flash_operands.hpp
// (the Qᵀ pack and K/V rows: in place, strided, 16-bit, paged), flash_scores.hpp (the score
// tile and the score rule's step 1); this file keeps the key loop, the task and the call.
//
// Do not use out-of-line std templates (std::vector, std::sort, ...) in these files: an
// instantiation compiled with -mavx2 could be the copy the linker keeps for the whole
// program (COMDAT), and a CPU without AVX2 would then fault in generic code.
//
// ── The algorithm (FlashAttention-2, transposed for a CPU) ──────────────────────────
// One task = (b, h, a block of Mb queries) — or, for Lq < Mb, all queries of several
// heads sharing a KV head (see run_flash). For it:
//   Qᵀ  is packed once into panels of 16 queries: QT[panel][d][16] (zero-padded past Lq).
//   for each block of ≤ Nb keys inside the union of the queries' visible key ranges:
//     Sᵀ[j][i] = (K[j]·Q[i]) · scale                       ← Sᵀ: (keys, queries)
//     Sᵀ[j][i] ← the score rule (scores.hpp): softcap and ALiBi over the whole tile
//                (tile_modifiers, vectorised along the contiguous query columns), then
//                masks, key interval → −inf
//     m_new[i] = max(m[i], maxⱼ Sᵀ[j][i])                 (vertical: vectorised over i)
//     α[i]     = 2^((m[i] − m_new[i])·log2 e)
//     Pᵀ[j][i] = 2^((Sᵀ[j][i] − m_new[i])·log2 e);   l[i] = α[i]·l[i] + Σⱼ Pᵀ[j][i]
//     Oᵀ[d][i] = α[i]·Oᵀ[d][i] + Σⱼ V[j][d]·Pᵀ[j][i]       ← Oᵀ: (Dv, queries)
//   O[i][d] = Oᵀ[d][i] / l[i];   lse[i] = m[i] + ln l[i]   (l = 0: O = 0, lse = −inf;
//                                                          l NaN: O and lse NaN)
// With few tasks for the machine's cores, a task's keys are split into chunks run as separate
// items and merged per task afterwards ("Key splits" below); with keys that outgrow the L2, a
// few consecutive query blocks of a head run in lockstep over the key blocks, so each K/V tile
// is read from memory once for them ("Groups of query blocks" below).
// Sinks: a row starts at m = σ_h, l = 1 (= e^{σ_h − m}), Oᵀ = 0 — the sink is one more
// logit with value 0, and the online softmax rescales it like any key. A row with no
// visible key then ends with O = 0 and lse = σ_h.
// Every exp is the ISA's exp2 of a difference times log2 e. Scores stay in natural units
// (not pre-multiplied by log2 e): a finite mask value of −FLT_MAX times log2 e would
// overflow to −inf and turn a finite score into a masked key.
//
// Non-finite values (kernels/finite.hpp): a key a column cannot see has Pᵀ = 0 exactly,
// but 0·NaN in P·V is NaN. Where a tile can hold zeros of P (the score rule or dropout
// ran on it), the V rows of its key block are checked once; only if one holds NaN/±inf
// does P·V run on a copy with those entries 0, adding each back where P is not 0.
// Large finite V (|v| near FLT_MAX) can overflow the unnormalised Oᵀ although O cannot:
// a task whose Oᵀ ends non-finite is computed again on finite.hpp's careful path (large
// entries in a second accumulator scaled by 2^-64), so the common path pays one check of
// Oᵀ per task.
//
// Why transposed (keys × queries) rather than the usual (queries × keys): both
// micro-kernels then read K and V by *broadcasting scalars* straight from the caller's
// tensors — any row stride, no packing, no transpose — while the 16 queries of a panel
// are the vector lanes. The row max, row sum and the α rescale become vertical vector
// ops (no horizontal reductions), and α is applied for free when the Oᵀ accumulators
// are loaded. Only Qᵀ (once per task) is packed. K or V whose head dim is not
// contiguous (stride(3) != 1), or that is float16/bfloat16, are read (converted) into a
// packed tile buffer per key block — a tile buffer for the micro-kernel, not a copy of
// the tensor; the conversion costs Nb·D loads per key block against Nb·D·Mb FMAs.
//
// ── Where the FLOPs go (per visible (query, key) pair) ──────────────────────────────
//   Q·Kᵀ: Dk FMAs (micro-kernel qk, AVX2: 6 keys × 16 queries = 12 ymm accumulators; per d:
//         2 vector loads of Qᵀ, 6 broadcasts of K, 12 FMAs. AVX-512: 8 keys × 32 queries =
//         16 zmm; per d: 2 loads, 8 broadcasts, 16 FMAs)
//   P·V:  Dv FMAs (micro-kernel pv: the same tiles over head-dim rows; per key: 2 vector
//         loads of Pᵀ, 6 (8) broadcasts of V, 12 (16) FMAs)
//   softmax: 1 max, 1 sub, exp2 (6 FMAs + ~6 other ops), 1 add  — per 8 pairs, i.e.
//         ≈ 15 vector ops against (Dk + Dv) FMAs: ≈ 12 % extra at D = 64, 6 % at 128.
//   counted (the benchmark's formula): 2·Dk + 2·Dv FLOPs per pair = 4·D.
//
// ── Tiles ────────────────────────────────────────────────────────────────────────────
// Register tile 6 × 16 (AVX2): 12 accumulators + 2 panel vectors + 1 broadcast = 15 of 16 ymm;
// 8 × 32 (AVX-512): 16 + 2 of 32 zmm. Panel width and rows are Ops::kPanel / Ops::kRows.
// Mb (queries per task) = Nb (keys per block) = 64 (flash_default_tiles): Qᵀ, Sᵀ and Oᵀ
// of a task are 16 KiB each at D = 64, so the micro-kernels stream from L1/L2. Measured
// in dev/flash_lab.cpp (1 thread, L = 4096, GFLOP per CPU-second on the shared machine,
// ± 5; FMA loop 73–80 in the same runs). Losing sizes:
//     D = 64:  Mb×Nb 32×32 44.0 | 32×64 64.4 | 64×32 60.6 | 64×128 61.2 | 128×64 60.2 | 128×128 66.3
//              64×64 (kept) 67.2
//     D = 128: 32×32 69.9 | 64×32 58.5 | 64×128 69.0 | 128×128 67.1 | 128×256 68.7 | 64×64 (kept) 68.7
// i.e. flat within the noise except small key blocks; one size for every head dim.
// The per-thread workspace is allocated once per call, before the task loop.
//
// ── Operand hooks (bf16 compute) ────────────────────────────────────────────────────
// An Ops may take over how Q, K and V are read and how the two products run, by defining
// (all or none; flash_avx512.cpp's Avx512Bf16Ops does, with bf16 pairs for vdpbf16ps):
//   scratch_bytes(p, t)           bytes of per-thread scratch it needs (Workspace::extra)
//   pack_q(p, w, b, nq, panels)   its own packed Qᵀ into w.qt (which holds Mb·Dk floats)
//   qk_block(p, w, b, hk, panels, j0, nk, ldS, scale)   Sᵀ of keys [j0, j0+nk), all panels
//   v_rows(p, b, hk, j0, nk, vbuf, ldv)   V rows of the key block as float32 (nk × Dv)
//   softmax_block(w, ldS, nk, ncols, pack, keep_f32)   the online softmax of the key block (m,
//                                 l, α as Ops::softmax); pack: it also leaves Pᵀ in its own form for
//                                 pv_block; keep_f32: Sᵀ must hold the float32 Pᵀ afterwards (dropout,
//                                 the non-finite and careful paths read it), else Sᵀ may be left as is
//   pv_block(p, w, b, hk, j0, panels, nk, ldS, vp, ldv, acc, ldO, packed)  acc ← α·acc + V·Pᵀ: V
//                                 float32 rows vp, or vp = nullptr: keys [j0, j0+nk) of V read by
//                                 the Ops itself (the driver then calls v_rows only where it checks
//                                 V); packed: Pᵀ as softmax_block packed it, else from the float32 Sᵀ
// Without them the driver runs the float32 code below (pack_qt, tile_rows, Ops::qk, Ops::pv).
// Everything else (score rule, softmax, non-finite handling, outputs) sees float32 Sᵀ,
// Pᵀ and V rows either way.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "../../core/dropout.hpp"
#include "../../sdpa/problem.hpp"
#include "../finite.hpp"
#include "../paged_rows.hpp"
#include "../scores.hpp"
#include "../store_row.hpp"
#include "flash.hpp"

#ifndef ATTN_FLASH_NS
#error "define ATTN_FLASH_NS before including flash_driver.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

// Queries per panel (the vector lanes of a micro-kernel tile): Ops::kPanel, per ISA (16: the
// portable and AVX2 paths; 32 = 2 zmm: AVX-512). Deliberately no global default: the driver
// must use Ops::kPanel everywhere (a 16-query default once covered half of an AVX-512 panel).
// Keys (qk) or head-dim rows (pv) per micro-kernel tile: Ops::kRows, per ISA (AVX2 6 rows ×
// 2 ymm, AVX-512 8 rows × 2 zmm; see the Ops of each flash_<isa>.cpp).
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr float kPosInf = std::numeric_limits<float>::infinity();

inline std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
inline std::int64_t imax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

// Step 1 of the score rule for an Ops that applies it in its Q·Kᵀ micro-kernel's store
// (Ops::qk_modified; AVX-512): each score s = c2·acc becomes c·tanh(s·inv_cap) when cap > 0,
// then s − slope[col]·|rel[col] − j| for key j of the tile when slope is set — the same
// operations as tile_modifiers, without a second pass over the Sᵀ tile. slope/rel point at the
// micro-kernel's panel (w.aslope/w.abase from alibi_columns).
struct QkModifiers {
    float cap = 0.0f, inv_cap = 0.0f;
    const float* slope = nullptr;
    const float* rel = nullptr;
};
template <class Ops>
inline constexpr bool kOpsFuseModifiers = requires { &Ops::qk_modified; };

// Whether Ops defines the operand hooks (see the header).
template <class Ops>
inline constexpr bool kOpsOwnOperands = requires { &Ops::qk_block; };

}  // namespace attn::detail::ATTN_FLASH_NS

// The driver's parts, in the ISA's namespace like this file: the workspace, the operands, the
// score tile (each says what it holds).
#include "flash_workspace.hpp"
#include "flash_operands.hpp"
#include "flash_scores.hpp"

namespace attn::detail::ATTN_FLASH_NS {

// Dropout on one tile of weights: Pᵀ[j][c] *= (keep ? 1/(1−p) : 0) for the call's indices
// (b, ch[c], ci[c], j0 + j), as src/core/dropout.hpp defines them (plus the call's origin,
// Dropout::fill_row). Called after the
// softmax has folded the undropped P into m and l, so lse stays the undropped one.
// s: (nk, ldS) keys j0.., columns 0..nq
template <class Ops>
void apply_dropout(const Dropout& drop, Workspace& w, std::int64_t b, int nq, std::int64_t j0, std::int64_t nk,
                   float* s, int ldS) {
    for (int c = 0; c < nq; ++c) {
        const float* f = drop.fill_row(Ops::dropout_row, b, w.ch[c], w.ci[c], j0, nk, w.drop);
        for (std::int64_t j = 0; j < nk; ++j) s[j * ldS + c] *= f[j];
    }
}

// The selecting path's second half: each NaN/±inf entry V[j][d] of keys [j0, j0+nk)
// (read through the view or the page table) is added as Pᵀ[j][c]·V[j][d] to the columns whose weight is
// not 0; P·V already ran with these entries 0. For an affected (d, c) the sum is NaN or
// ±inf whatever the order, so adding them last changes nothing else.
template <class Ops>
void add_nonfinite_v(const SdpaProblem& p, Workspace& w, std::int64_t b, std::int64_t hk, std::int64_t j0,
                     std::int64_t nk, int ncols, int ldS, int ldO) {
    for (std::int64_t j = 0; j < nk; ++j)
        for (std::int64_t d = 0; d < p.Dv; ++d) {
            const float x = load_elem<Ops>(p.v, kv_row_offset(p, true, b, hk, j0 + j) + d * p.v.stride(3));
            if (!nonfinite_f32(x)) continue;
            const float* pj = w.s + j * ldS;
            float* od = w.ot + d * ldO;
            for (int c = 0; c < ncols; ++c)
                if (pj[c] != 0.0f) od[c] += pj[c] * x;
        }
}

// What finish_block writes of a column (bit flags; merge_block's rows in parts).
inline constexpr unsigned char kStoreOut = 1, kStoreStats = 2;

// The scores output (attn::ScoresOutput) of the block's columns, every key, tile by tile:
// the same score_tile as the softmax, stopped at the requested stage. store: see finish_block.
template <class Ops>
void write_scores(const SdpaProblem& p, const FlashTiles& t, Workspace& w, std::int64_t b, std::int64_t hk, int nq,
                  int panels, int ldS, float scale, const unsigned char* store) {
    const TensorView& S = *p.scores;
    const bool f32 = S.dtype() == DType::f32;
    const std::int64_t sj = S.stride(3);
    for (std::int64_t j0 = 0; j0 < p.Lk; j0 += t.Nb) {
        const std::int64_t nk = imin(t.Nb, p.Lk - j0);
        bool partial = false;
        for (int c = 0; c < nq && !partial; ++c) partial = w.lo[c] > j0 || w.hi[c] < j0 + nk;
        score_tile<Ops>(p, w, b, hk, nq, panels, j0, nk, ldS, scale, partial, p.scores_stage);
        for (int c = 0; c < nq; ++c) {
            if (store != nullptr && !(store[c] & kStoreStats)) continue;
            const std::int64_t base = S.offset(b, w.ch[c], w.ci[c], j0);
            if (f32) {
                float* o = S.data_as<float>() + base;
                for (std::int64_t j = 0; j < nk; ++j) o[j * sj] = w.s[j * ldS + c];
            } else {
                double* o = S.data_as<double>() + base;
                for (std::int64_t j = 0; j < nk; ++j) o[j * sj] = static_cast<double>(w.s[j * ldS + c]);
            }
        }
    }
}

// Oᵀ (acc) ← α·Oᵀ + Σⱼ V[j]·Pᵀ[j] for all panels: V rows vp (row stride ldv), Pᵀ in w.s.
// (b, hk, j0): where the key block's V rows are, for an Ops that reads them itself (vp = nullptr).
// p_packed: the operand hooks' softmax_block packed Pᵀ (see the header).
template <class Ops>
void pv_tile(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk, std::int64_t j0, int panels,
             std::int64_t nk, int ldS, const float* vp, std::int64_t ldv, float* acc, int ldO,
             [[maybe_unused]] bool p_packed) {
    if constexpr (kOpsOwnOperands<Ops>) {
        Ops::pv_block(p, w, b, hk, j0, panels, nk, ldS, vp, ldv, acc, ldO, p_packed);
        return;
    }
    for (int pn = 0; pn < panels; ++pn)
        for (std::int64_t d = 0; d < p.Dv; d += Ops::kRows)
            Ops::pv(w.s + pn * Ops::kPanel, ldS, vp + d, ldv, static_cast<int>(nk), static_cast<int>(imin(Ops::kRows, p.Dv - d)),
                    acc + d * ldO + pn * Ops::kPanel, ldO, w.alpha + pn * Ops::kPanel);
}

// The statistics a row starts from: a sink is the row's first logit (m = σ_h, l = 1), else
// nothing (m = −inf, l = 0). with_sinks = false: a key chunk's partial, whose merge adds the sink.
inline void start_rows(const SdpaProblem& p, Workspace& w, int nq, int ncols, bool with_sinks) {
    for (int c = 0; c < ncols; ++c) {
        const bool sink = with_sinks && p.sinks && c < nq;
        w.m[c] = sink ? p.sink(w.ch[c]) : kNegInf;
        w.l[c] = sink ? 1.0f : 0.0f;
    }
}

// The key loop of one task, in two parts (run_group interleaves several tasks' loops):
// start_keys sets up (m, l, Oᵀ) of the block's columns for keys [ulo, uhi); key_block then
// adds keys [j0, j0+nk), for j0 = ulo, ulo + Nb, … in turn, and requests the next block's K/V
// rows below ahead_end (prefetch_kv_rows; 0: none; see ahead_end). careful (finite.hpp): V's large
// entries go to bigot, scaled by 2^-64, and every key block takes the selecting path for
// non-finite entries. with_sinks: see start_rows. Returns whether ALiBi can zero a weight
// (key_block's alibi_zeros).
template <class Ops>
bool start_keys(const SdpaProblem& p, const FlashTiles& t, Workspace& w, std::int64_t b, int nq, int panels,
                std::int64_t ulo, std::int64_t uhi, bool careful, bool with_sinks) {
    start_rows(p, w, nq, panels * Ops::kPanel, with_sinks);
    // ALiBi turns a finite score into −inf (a zero of P that V's NaN/inf must not meet) only
    // when a bias slope·|d − j| reaches 2^103: below that, s − bias rounds to a finite value
    // for every finite s (half an ulp of FLT_MAX is 2^103). Bound the block's biases once.
    bool alibi_zeros = false;
    if (p.alibi_slopes) {
        const std::int64_t off = p.alibi_offset(b);
        double smax = 0.0, dmax = 0.0;
        for (int c = 0; c < nq; ++c) {
            smax = std::fmax(smax, std::fabs(static_cast<double>(p.alibi_slope(b, w.ch[c]))));
            const std::int64_t d = w.ci[c] + off;
            dmax = std::fmax(dmax, static_cast<double>(imax(d - ulo, uhi - 1 - d)));
        }
        alibi_zeros = smax * dmax >= 0x1p100;
    }
    const std::size_t acc_bytes = sizeof(float) * static_cast<std::size_t>(p.Dv) * static_cast<std::size_t>(t.Mb);
    std::memset(w.ot, 0, acc_bytes);
    if (careful) std::memset(w.bigot, 0, acc_bytes);
    return alibi_zeros;
}

template <class Ops>
void key_block(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, std::int64_t b,
               std::int64_t hk, int nq, int panels, std::int64_t j0, std::int64_t nk, std::int64_t ahead_end,
               bool careful, bool alibi_zeros) {
    const int ncols = panels * Ops::kPanel, ldS = t.Mb, ldO = t.Mb;
    const float scale = static_cast<float>(p.scale);
    bool partial = false;
    for (int c = 0; c < nq && !partial; ++c) partial = w.lo[c] > j0 || w.hi[c] < j0 + nk;
    if (j0 + nk < ahead_end) prefetch_kv_rows(p, b, hk, j0 + nk, imin(ahead_end, j0 + nk + t.Nb));
    score_tile<Ops>(p, w, b, hk, nq, panels, j0, nk, ldS, scale, partial);

    // Zeros of P only where a mask, ALiBi (a score that overflows to −inf: alibi_zeros) or
    // dropout ran: V is checked there (finite.hpp). Softcap keeps every score finite.
    const bool check = partial || p.has_elementwise_mask() || alibi_zeros || drop.active;
    // The operand hooks' softmax packs Pᵀ for pv_block unless dropout changes it first, and
    // keeps the float32 Pᵀ only for the paths that read it (dropout, checks, careful).
    const bool p_packed = kOpsOwnOperands<Ops> && !drop.active;
    if constexpr (kOpsOwnOperands<Ops>)
        Ops::softmax_block(w, ldS, static_cast<int>(nk), ncols, p_packed, careful || check);
    else
        Ops::softmax(w.s, ldS, static_cast<int>(nk), ncols, w.m, w.l, w.alpha);
    // One branch per tile: without dropout the tile goes straight to P·V.
    if (drop.active) apply_dropout<Ops>(drop, w, b, nq, j0, nk, w.s, ldS);

    const float* vp;
    std::int64_t ldv;
    bool select;
    if (careful) {
        // V's rows as float32 (16-bit: converted into vbuf; splitting in place is safe,
        // each entry is read before its two parts are written).
        const float* v = kv_tile_rows<Ops>(p, true, b, hk, j0, nk, p.Dv, w.vbuf, ldv, panels);
        select = false;
        for (std::int64_t j = 0; j < nk; ++j)
            for (std::int64_t d = 0; d < p.Dv; ++d)
                select |= split_large(v[j * ldv + d], w.vbuf[j * p.Dv + d], w.vbig[j * p.Dv + d]);
        vp = w.vbuf;
        ldv = p.Dv;
        pv_tile<Ops>(p, w, b, hk, j0, panels, nk, ldS, w.vbig, ldv, w.bigot, ldO, p_packed);
    } else {
        ldv = 0;
        if constexpr (kOpsOwnOperands<Ops>)  // float32 rows only to check them; else the Ops reads V
            vp = check ? Ops::v_rows(p, b, hk, j0, nk, w.vbuf, ldv) : nullptr;
        else
            vp = kv_tile_rows<Ops>(p, true, b, hk, j0, nk, p.Dv, w.vbuf, ldv, panels);
        select = check && any_nonfinite(vp, ldv, nk, p.Dv);
        if (select) {
            if (vp != w.vbuf)  // rows in place (view or page): their head dim is contiguous
                for (std::int64_t j = 0; j < nk; ++j) std::memcpy(w.vbuf + j * p.Dv, vp + j * ldv, sizeof(float) * static_cast<std::size_t>(p.Dv));
            for (std::int64_t e = 0; e < nk * p.Dv; ++e)
                if (nonfinite_f32(w.vbuf[e])) w.vbuf[e] = 0.0f;
            vp = w.vbuf;
            ldv = p.Dv;
        }
    }
    pv_tile<Ops>(p, w, b, hk, j0, panels, nk, ldS, vp, ldv, w.ot, ldO, p_packed);
    if (select) add_nonfinite_v<Ops>(p, w, b, hk, j0, nk, ncols, ldS, ldO);
}

// Where a task's key loop (keys below uhi) stops requesting each next key block's K/V rows
// (key_block, prefetch_kv_rows): at uhi when its tiles come from memory (kv_ahead: TaskGrid
// says when) or it has one panel (its micro-kernels reuse each line too little to hide even a
// cache's latency: 1.45-1.5x measured, docs/kernels.md); else 0, no requests.
inline std::int64_t ahead_end(bool kv_ahead, int panels, std::int64_t uhi) { return kv_ahead || panels == 1 ? uhi : 0; }

// The whole key loop of one task: (m, l, Oᵀ) of the block's columns from keys [ulo, uhi).
// kv_ahead: see ahead_end.
template <class Ops>
void accumulate_keys(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, std::int64_t b,
                     std::int64_t hk, int nq, int panels, std::int64_t ulo, std::int64_t uhi, bool careful,
                     bool kv_ahead, bool with_sinks = true) {
    const bool alibi_zeros = start_keys<Ops>(p, t, w, b, nq, panels, ulo, uhi, careful, with_sinks);
    const std::int64_t ahead = ahead_end(kv_ahead, panels, uhi);
    for (std::int64_t j0 = ulo; j0 < uhi; j0 += t.Nb)
        key_block<Ops>(p, t, drop, w, b, hk, nq, panels, j0, imin(t.Nb, uhi - j0), ahead, careful, alibi_zeros);
}

// A task's coordinates: queries [i0, i0+nq_head) of the nh query heads h0.. (all reading KV
// head hk) of batch b. Column c of its block is query i0 + c % nq_head of head h0 + c / nq_head.
struct TaskAt {
    std::int64_t b = 0, hk = 0, h0 = 0, i0 = 0;
    int nh = 0, nq_head = 0;
    bool kv_ahead = false;  // request each next key block's K/V rows (TaskGrid::kv_ahead)
};

// The block's columns in the workspace (w.ch, w.ci, w.lo, w.hi) and the union of their
// visible key ranges [ulo, uhi).
struct BlockCols {
    int nq = 0, panels = 0;
    std::int64_t ulo = 0, uhi = 0;
};
template <class Ops>
BlockCols block_columns(const SdpaProblem& p, Workspace& w, const TaskAt& a) {
    BlockCols k;
    k.nq = a.nh * a.nq_head;
    for (int c = 0; c < k.nq; ++c) {
        w.ch[c] = a.h0 + c / a.nq_head;
        w.ci[c] = a.i0 + c % a.nq_head;
    }
    k.panels = (k.nq + Ops::kPanel - 1) / Ops::kPanel;
    // Visible key range of each query; padding columns see nothing.
    k.ulo = p.Lk;
    k.uhi = 0;
    for (int c = 0; c < k.panels * Ops::kPanel; ++c) {
        KeyRange r{0, 0};
        if (c < k.nq) r = p.key_range(a.b, w.ci[c]);
        if (r.empty()) r = KeyRange{0, 0};
        w.lo[c] = r.lo;
        w.hi[c] = r.hi;
        if (!r.empty()) {
            k.ulo = imin(k.ulo, r.lo);
            k.uhi = imax(k.uhi, r.hi);
        }
    }
    return k;
}

template <class Ops>
void pack_block_q(const SdpaProblem& p, Workspace& w, std::int64_t b, const BlockCols& k) {
    if constexpr (kOpsOwnOperands<Ops>) Ops::pack_q(p, w, b, k.nq, k.panels);
    else pack_qt<Ops>(p, b, w.ch, w.ci, k.nq, k.panels, Ops::kPanel, w.qt, w.qrow);
}

// The block's outputs from its finished statistics (w.m, w.l) and unnormalised Oᵀ (w.ot; with
// w.bigot when careful): O, lse, and the scores and weights passes (which need Qᵀ in w.qt).
// store (null: everything): per column, which of them to write — kStoreOut (O) and kStoreStats
// (lse, scores, weights); merge_block stores a task's rows in parts.
template <class Ops>
void finish_block(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, std::int64_t b,
                  std::int64_t hk, const BlockCols& k, bool careful, const unsigned char* store = nullptr) {
    const int nq = k.nq, panels = k.panels, ncols = panels * Ops::kPanel, ldS = t.Mb, ldO = t.Mb;
    const std::int64_t ulo = k.ulo, uhi = k.uhi;
    const float scale = static_cast<float>(p.scale);  // the weights and scores passes
    // O = Oᵀ / l, transposed into the caller's layout; lse. l = 0: no visible key (O = 0,
    // lse = −inf); l NaN (a visible NaN/±inf score): O and lse NaN. O in out's dtype
    // (store_row: 16-bit rounds the float32 value once); lse float32 or float64.
    // Whole groups of 16 columns of an out with a contiguous head dim go 16 × 16 at a time
    // (transpose16, "Per-task work" in flash_operands.hpp; a 16-bit out through a float tile
    // and Ops::narrow16, attn/half.hpp's rounding of the same float32 products); the rest
    // column by column.
    int stored = 0;
    if constexpr (kOpsTranspose<Ops>) {
        const bool sixteen = is16(p.out);
        if (!careful && store == nullptr && (p.out.dtype() == DType::f32 || sixteen) && p.out.stride(3) == 1 &&
            p.Dv % 16 == 0) {
            const bool f16 = p.out.dtype() == DType::f16;
            alignas(64) float tile[16][16];
            const float* in[16];
            float* out[16];
            std::int64_t at[16];  // element offset of each column's row of out
            for (; stored + 16 <= nq; stored += 16) {
                for (int c = 0; c < 16; ++c) {
                    const float l = w.l[stored + c];
                    w.alpha[stored + c] = l == 0.0f ? 0.0f : 1.0f / l;  // α is free after the key loop
                    at[c] = p.out.offset(b, w.ch[stored + c], w.ci[stored + c], 0);
                    out[c] = sixteen ? tile[c] : p.out.data_as<float>() + at[c];
                }
                for (std::int64_t d0 = 0; d0 < p.Dv; d0 += 16) {
                    for (int r = 0; r < 16; ++r) in[r] = w.ot + (d0 + r) * ldO + stored;
                    Ops::transpose16(in, out, w.alpha + stored);
                    if (sixteen) {
                        for (int c = 0; c < 16; ++c)
                            Ops::narrow16(tile[c], p.out.data_as<std::uint16_t>() + at[c] + d0, 16, f16);
                    } else {
                        for (int c = 0; c < 16; ++c) out[c] += 16;
                    }
                }
            }
        }
    }
    for (int c = 0; c < nq; ++c) {
        const float l = w.l[c];
        const float inv = l == 0.0f ? 0.0f : 1.0f / l;
        const std::int64_t base = p.out.offset(b, w.ch[c], w.ci[c], 0), sd = p.out.stride(3);
        if (store == nullptr || (store[c] & kStoreOut)) {
            if (careful)  // fold the large part back in (finite.hpp), then the same stores
                for (std::int64_t d = 0; d < p.Dv; ++d)
                    w.ot[d * ldO + c] = combine_large(w.ot[d * ldO + c], w.bigot[d * ldO + c], inv, !drop.active);
            if (c >= stored) store_row(p.out, base, sd, w.ot + c, ldO, p.Dv, careful ? 1.0f : inv);
        }
        if (store != nullptr && !(store[c] & kStoreStats)) continue;
        if (p.weights) w.lse2[c] = l == 0.0f ? 0.0f : std::log2(l);  // only the weights pass reads it
        if (p.lse) {
            const double lse = l == 0.0f ? -std::numeric_limits<double>::infinity()
                                         : static_cast<double>(w.m[c]) + std::log(static_cast<double>(l));
            const std::int64_t at = p.lse->offset(b, w.ch[c], w.ci[c]);
            if (p.lse->dtype() == DType::f32) p.lse->data_as<float>()[at] = static_cast<float>(lse);
            else p.lse->data_as<double>()[at] = lse;
        }
    }

    if (p.scores) write_scores<Ops>(p, t, w, b, hk, nq, panels, ldS, scale, store);
    if (!p.weights) return;
    // Weights from the saved statistics, tile by tile: P = 2^((S − m)·log2 e − log2 l)
    // (= exp(S − lse)); a row with no visible key gets m = +inf so every P is exactly 0.
    for (int c = 0; c < ncols; ++c)
        if (w.l[c] == 0.0f) {
            w.m[c] = kPosInf;
            w.lse2[c] = 0.0f;
        }
    const TensorView& W = *p.weights;
    const bool w_f32 = W.dtype() == DType::f32;
    const std::int64_t wj = W.stride(3);
    for (int c = 0; c < nq; ++c) {  // keys outside every tile: 0
        if (store != nullptr && !(store[c] & kStoreStats)) continue;
        const std::int64_t base = W.offset(b, w.ch[c], w.ci[c], 0);
        for (std::int64_t j = 0; j < p.Lk; ++j) {
            if (j == ulo && ulo < uhi) j = uhi;
            if (j >= p.Lk) break;
            if (w_f32) W.data_as<float>()[base + j * wj] = 0.0f;
            else W.data_as<double>()[base + j * wj] = 0.0;
        }
    }
    for (std::int64_t j0 = ulo; j0 < uhi; j0 += t.Nb) {
        const std::int64_t nk = imin(t.Nb, uhi - j0);
        bool partial = false;
        for (int c = 0; c < nq && !partial; ++c) partial = w.lo[c] > j0 || w.hi[c] < j0 + nk;
        score_tile<Ops>(p, w, b, hk, nq, panels, j0, nk, ldS, scale, partial);
        Ops::weights_exp(w.s, ldS, static_cast<int>(nk), ncols, w.m, w.lse2);
        // The weights that multiplied V: dropped and rescaled, as the reference returns them.
        if (drop.active) apply_dropout<Ops>(drop, w, b, nq, j0, nk, w.s, ldS);
        for (int c = 0; c < nq; ++c) {
            if (store != nullptr && !(store[c] & kStoreStats)) continue;
            const std::int64_t base = W.offset(b, w.ch[c], w.ci[c], j0);
            if (w_f32) {
                float* o = W.data_as<float>() + base;
                for (std::int64_t j = 0; j < nk; ++j) o[j * wj] = w.s[j * ldS + c];
            } else {
                double* o = W.data_as<double>() + base;
                for (std::int64_t j = 0; j < nk; ++j) o[j * wj] = static_cast<double>(w.s[j * ldS + c]);
            }
        }
    }
}

// A task after its key loop (w.m, w.l, w.ot over every visible key): overflow of Σ p·v (large
// finite V) or a visible NaN/±inf computes the loop again carefully; then the outputs (store:
// see finish_block). Padding columns (c ≥ nq) are not looked at: they accumulate V too but
// nothing reads them.
template <class Ops>
void finish_task(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, const TaskAt& a,
                 const BlockCols& k, const unsigned char* store = nullptr) {
    const bool careful = any_nonfinite(w.ot, t.Mb, p.Dv, k.nq);
    if (careful) accumulate_keys<Ops>(p, t, drop, w, a.b, a.hk, k.nq, k.panels, k.ulo, k.uhi, true, a.kv_ahead);
    finish_block<Ops>(p, t, drop, w, a.b, a.hk, k, careful, store);
}

// One task, whole: its columns, Qᵀ, the key loop over every visible key, the outputs (store:
// see finish_block).
template <class Ops>
void run_block(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, const TaskAt& a,
               const unsigned char* store = nullptr) {
    const BlockCols k = block_columns<Ops>(p, w, a);
    pack_block_q<Ops>(p, w, a.b, k);
    accumulate_keys<Ops>(p, t, drop, w, a.b, a.hk, k.nq, k.panels, k.ulo, k.uhi, false, a.kv_ahead);
    finish_task<Ops>(p, t, drop, w, a, k, store);
}

// ── Groups of query blocks (flash_query_group: long key ranges) ────────────────────────
// A task streams every K and V row it can see; when a head's K and V are larger than the
// caches hold (Lk in the tens of thousands), each task reads them from memory again and the
// products wait for it. A group runs n consecutive tasks of one (b, KV head) — query blocks of
// one query head, or of the heads that share the KV head (GQA) — in lockstep over their key
// blocks: key block j0 of task 0, of task 1, …, then the next, so
// the rows are read from memory once for the n tasks and then from the L2 (each task's Qᵀ,
// Sᵀ and Oᵀ stay in its own workspace). Each task's own steps and their order are run_block's,
// so the bits are too. The lockstep needs every task's key blocks to start at the same key:
// a group whose tasks' visible ranges start apart (a sliding window) runs task by task.
template <class Ops>
void run_group(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace* const* ws, const TaskAt* a,
               int n) {
    if (n == 1) {  // most items: an ungrouped task
        run_block<Ops>(p, t, drop, *ws[0], a[0]);
        return;
    }
    BlockCols k[kMaxQueryGroup];
    std::int64_t ulo = p.Lk, uhi = 0;
    bool aligned = true;
    for (int i = 0; i < n; ++i) {
        k[i] = block_columns<Ops>(p, *ws[i], a[i]);
        if (k[i].ulo >= k[i].uhi) continue;  // sees no key
        aligned = aligned && (uhi == 0 || k[i].ulo == ulo);
        ulo = imin(ulo, k[i].ulo);
        uhi = imax(uhi, k[i].uhi);
    }
    if (!aligned) {  // rare (windows): task by task (each run_block sets its columns again)
        for (int i = 0; i < n; ++i) run_block<Ops>(p, t, drop, *ws[i], a[i]);
        return;
    }
    bool alibi_zeros[kMaxQueryGroup];
    for (int i = 0; i < n; ++i) {
        pack_block_q<Ops>(p, *ws[i], a[i].b, k[i]);
        alibi_zeros[i] = start_keys<Ops>(p, t, *ws[i], a[i].b, k[i].nq, k[i].panels, k[i].ulo, k[i].uhi, false, true);
    }
    // The first task that reads a key block and has a next one requests it (ahead_end); the
    // others find its rows in the cache. A task whose keys end at this block requests nothing,
    // so a later task of the group (a longer key range) does.
    for (std::int64_t j0 = ulo; j0 < uhi; j0 += t.Nb) {
        bool requested = false;
        for (int i = 0; i < n; ++i)
            if (j0 >= k[i].ulo && j0 < k[i].uhi) {
                const std::int64_t nk = imin(t.Nb, k[i].uhi - j0);
                const std::int64_t ahead = requested ? 0 : ahead_end(a[i].kv_ahead, k[i].panels, k[i].uhi);
                requested = requested || ahead > j0 + nk;
                key_block<Ops>(p, t, drop, *ws[i], a[i].b, a[i].hk, k[i].nq, k[i].panels, j0, nk, ahead, false,
                               alibi_zeros[i]);
            }
    }
    for (int i = 0; i < n; ++i) finish_task<Ops>(p, t, drop, *ws[i], a[i], k[i]);
}

// ── Key splits (flash_key_chunk: few tasks on many cores) ────────────────────────────────
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

// How one problem splits into tasks. Blocks: Mb queries of one head; or, when Lq < Mb
// (decode, short queries), all Lq queries of up to Mb / Lq heads that share a KV head
// (GQA/MQA), so the 16-lane panels are not mostly padding and each K/V tile read serves every
// head of the group.
struct TaskGrid {
    std::int64_t qpb = 0, hpb = 0, qblocks = 0, hchunks = 0, tasks = 0;
    std::int64_t kv_tasks = 0;  // tasks per (b, KV head): hchunks · qblocks, consecutive in task order
    bool kv_ahead = false;      // the tasks' K/V tiles come from memory: flash_kv_ahead
};


inline TaskGrid task_grid(const SdpaProblem& p, const FlashTiles& t) {
    TaskGrid g;
    g.qpb = p.Lq >= t.Mb ? t.Mb : p.Lq;                   // queries per block
    g.hpb = imax(1, imin(p.group, t.Mb / g.qpb));         // heads per block
    g.qblocks = (p.Lq + g.qpb - 1) / g.qpb;
    g.hchunks = (p.group + g.hpb - 1) / g.hpb;
    g.kv_tasks = g.hchunks * g.qblocks;
    g.tasks = p.B * p.Hkv * g.kv_tasks;
    g.kv_ahead = flash_kv_ahead(g.kv_tasks, head_kv_bytes(p));
    return g;
}

// Task `task` of problem p (0 <= task < g.tasks).
inline TaskAt task_at(const SdpaProblem& p, const TaskGrid& g, std::int64_t task) {
    // Query blocks last to first: under a causal mask (either alignment) a later block
    // sees more keys, so the longest tasks go first and the dynamic schedule ends on
    // short ones (longest-first; the order changes no result: tasks are independent).
    const std::int64_t qb = g.qblocks - 1 - task % g.qblocks, hc = (task / g.qblocks) % g.hchunks;
    const std::int64_t bk = task / (g.qblocks * g.hchunks);
    TaskAt a;
    a.b = bk / p.Hkv;
    a.hk = bk % p.Hkv;
    a.h0 = a.hk * p.group + hc * g.hpb;
    a.i0 = qb * g.qpb;
    a.nh = static_cast<int>(imin(g.hpb, p.group - hc * g.hpb));
    a.nq_head = static_cast<int>(imin(g.qpb, p.Lq - a.i0));
    a.kv_ahead = g.kv_ahead;
    return a;
}

// How one problem of a batch runs: its grid, its key chunk (0: tasks whole) and where its items,
// partial slots and merges start in the batch's lists.
struct JobPlan {
    TaskGrid g;
    std::int64_t chunk = 0, chunks = 1;
    int group = 1;                 // tasks per item (run_group) when chunks = 1
    std::int64_t group_items = 0;  // items per (b, KV head): ⌈g.kv_tasks / group⌉
    std::int64_t first_item = 0, first_slot = 0, first_merge = 0;
};

// The problem i with plans[i].*field <= x < plans[i + 1].*field (binary search; plans has n + 1).
inline std::int64_t job_of(const JobPlan* plans, std::int64_t n, std::int64_t JobPlan::*field, std::int64_t x) {
    std::int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const std::int64_t mid = (lo + hi + 1) / 2;
        if (plans[mid].*field <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// A batch of problems (FlashJob: sdpa_varlen's sequences, or one problem): the items of all
// of them in one list over OpenMP threads — a whole task (problem, b, h, query block), a group
// of consecutive tasks of one KV head (flash_query_group), or a task's key chunk when the
// problem splits its keys (flash_key_chunk) — in the order given
// (flash_forward_batch puts the problems with the longest tasks first), so a batch pays one
// fork/join and one tail instead of one per problem; then the split tasks' merges. Each item
// is computed by one thread from start to end in a fixed order, and a problem's split depends
// on its own shape and the machine only, so the result does not depend on the number of
// threads, the schedule or which problems share the batch. How this split behaves on 2 to 64
// cores: docs/kernels.md, "Parallel split and scaling".
// Precondition (flash.cpp checks it): every problem has the head dims of jobs[0].
template <class Ops>
void run_flash(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) {
    // A block holds whole panels: Mb rounded up to a multiple of this ISA's panel (only a
    // test's or the lab's Mb = 16 changes, to 32 on the AVX-512 path).
    FlashTiles t = tiles;
    t.Mb = (t.Mb + Ops::kPanel - 1) / Ops::kPanel * Ops::kPanel;
    // malloc, not std::vector: see the note at the top of this file. plans[n] holds the totals.
    JobPlan* plans = static_cast<JobPlan*>(std::malloc(sizeof(JobPlan) * static_cast<std::size_t>(n + 1)));
    if (plans == nullptr) throw std::bad_alloc();
    bool pack_k = false;
    int max_group = 1;
    std::size_t extra = 0;
    const std::int64_t sf = slot_floats(*jobs[0].p, t);  // the same head dims in every problem
    JobPlan sum;
    for (std::int64_t i = 0; i < n; ++i) {
        const SdpaProblem& p = *jobs[i].p;
        JobPlan& j = plans[i];
        j = sum;
        j.g = task_grid(p, t);
        j.chunk = flash_key_chunk(j.g.tasks, p.Lk, t.Nb, sf, t.key_splits);
        j.chunks = j.chunk > 0 ? (p.Lk + j.chunk - 1) / j.chunk : 1;
        const std::int64_t kv_heads = p.B * p.Hkv;
        j.group = j.chunks > 1 ? 1
                               : flash_query_group(kv_heads, j.g.kv_tasks, head_kv_bytes(p),
                                                   (p.Dk + p.Dv) * t.Mb * static_cast<std::int64_t>(sizeof(float)), t.query_group);
        j.group_items = (j.g.kv_tasks + j.group - 1) / j.group;
        sum.first_item += j.chunks > 1 ? j.g.tasks * j.chunks : kv_heads * j.group_items;
        max_group = j.group > max_group ? j.group : max_group;
        if (j.chunks > 1) {
            sum.first_slot += j.g.tasks * j.chunks;
            sum.first_merge += j.g.tasks;
        }
        // paged: tiles across pages; one-panel tasks of large heads copy their tiles (pack_tile_rows)
        pack_k = pack_k || p.paged != nullptr || !in_place(p.k, p.Dk) || pack_tile_rows(p, 1);
        if constexpr (kOpsOwnOperands<Ops>) extra = extra > Ops::scratch_bytes(p, t) ? extra : Ops::scratch_bytes(p, t);
    }
    plans[n] = sum;
    // The problems run in waves whose partials fit kMaxWaveFloats (flash_key_chunk caps one
    // problem's; many split problems in one varlen batch could add up to far more). Almost always
    // one wave; a problem's items never change with the wave it is in.
    constexpr std::int64_t kMaxWaveFloats = 64LL << 20;  // 256 MiB, the per-problem cap
    auto wave_end = [&](std::int64_t i0) {  // the wave starting at problem i0 is [i0, wave_end(i0))
        std::int64_t i1 = i0 + 1;
        while (i1 < n && (plans[i1 + 1].first_slot - plans[i0].first_slot) * sf <= kMaxWaveFloats) ++i1;
        return i1;
    };
    std::int64_t wave_slots = 0;  // the largest wave's
    for (std::int64_t i0 = 0, i1; i0 < n; i0 = i1) {
        i1 = wave_end(i0);
        wave_slots = imax(wave_slots, plans[i1].first_slot - plans[i0].first_slot);
    }
    float* partials = nullptr;
    if (wave_slots > 0) {
        partials = static_cast<float*>(std::malloc(sizeof(float) * static_cast<std::size_t>(wave_slots * sf)));
        if (partials == nullptr) {
            std::free(plans);
            throw std::bad_alloc();
        }
    }
    const int nthreads = threads > 0 ? threads : omp_get_max_threads();
    bool alloc_failed = false;
    for (std::int64_t i0 = 0, i1; i0 < n && !alloc_failed; i0 = i1) {
        i1 = wave_end(i0);
        const JobPlan& a = plans[i0];
        const JobPlan& z = plans[i1];
        const std::int64_t items = z.first_item - a.first_item, nw = i1 - i0;
#pragma omp parallel num_threads(nthreads) if (items > 1)
        {
            // Once per thread, before the task loop: one workspace per task of a group.
            alignas(Workspace) unsigned char raw[kMaxQueryGroup][sizeof(Workspace)];
            Workspace* ws[kMaxQueryGroup] = {};
            bool failed = false;
            for (int g = 0; g < max_group; ++g) {
                ws[g] = new (raw[g]) Workspace(*jobs[0].p, t, pack_k, extra);
                failed = failed || ws[g]->block == nullptr;
            }
            Workspace& w = *ws[0];
            if (failed) {
#pragma omp atomic write
                alloc_failed = true;
            }
#pragma omp for schedule(dynamic, 1)
            for (std::int64_t item = a.first_item; item < z.first_item; ++item) {
                if (failed) continue;
                const std::int64_t i = i0 + job_of(plans + i0, nw, &JobPlan::first_item, item);
                const JobPlan& j = plans[i];
                const SdpaProblem& p = *jobs[i].p;
                const std::int64_t k = item - j.first_item;
                if (j.chunks == 1) {  // item k: a group of the tasks of (b, KV head) k / group_items
                    const std::int64_t r = k % j.group_items, first = (k / j.group_items) * j.g.kv_tasks + r * j.group;
                    const int count = static_cast<int>(imin(j.group, j.g.kv_tasks - r * j.group));
                    TaskAt at[kMaxQueryGroup];
                    for (int g = 0; g < count; ++g) at[g] = task_at(p, j.g, first + g);
                    run_group<Ops>(p, t, jobs[i].drop, ws, at, count);
                } else {  // item k: chunk k % chunks of task k / chunks
                    const std::int64_t c0 = (k % j.chunks) * j.chunk, slot = j.first_slot - a.first_slot + k;
                    run_chunk<Ops>(p, t, jobs[i].drop, w, task_at(p, j.g, k / j.chunks), c0, imin(p.Lk, c0 + j.chunk),
                                   partials + slot * sf);
                }
            }
            // (the omp for's barrier: every partial is written before a merge reads it)
#pragma omp for schedule(dynamic, 1)
            for (std::int64_t m = a.first_merge; m < z.first_merge; ++m) {
                if (failed) continue;
                const std::int64_t i = i0 + job_of(plans + i0, nw, &JobPlan::first_merge, m);
                const JobPlan& j = plans[i];
                const SdpaProblem& p = *jobs[i].p;
                const std::int64_t task = m - j.first_merge, slot = j.first_slot - a.first_slot + task * j.chunks;
                merge_block<Ops>(p, t, jobs[i].drop, w, task_at(p, j.g, task), partials + slot * sf, j.chunks);
            }
            for (int g = 0; g < max_group; ++g) ws[g]->~Workspace();
        }
    }
    std::free(partials);
    std::free(plans);
    if (alloc_failed) throw std::bad_alloc();
}

}  // namespace attn::detail::ATTN_FLASH_NS
