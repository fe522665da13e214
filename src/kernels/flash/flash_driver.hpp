// The flash forward driver: tiling, the score rule, online softmax, output. Included by
// one .cpp per ISA (flash_portable.cpp, flash_avx2.cpp, flash_avx512.cpp), each of which first defines
// ATTN_FLASH_NS (a namespace of its own, so the compilations never share a symbol)
// and a struct of micro-kernels `Ops` (the signatures: each Ops's definition; Ops::dropout_row
// fills the dropout factors of a row segment, see src/core/dropout.hpp; Ops::widen(src,
// stride, n, is_f16, dst) converts n float16/bfloat16 values at an element stride to float32).
//
// Its parts, one concept each: flash_workspace.hpp (the per-thread scratch), flash_operands.hpp
// (the Qᵀ pack and K/V rows: in place, strided, 16-bit, paged), flash_scores.hpp (the score
// tile and the score rule's step 1); this file (the key loop and one task, run_block);
// flash_query_groups.hpp (tasks taking turns over long keys), flash_key_splits.hpp (a task's
// keys in chunks, merged) and flash_schedule.hpp (the call: tasks over threads, run_flash).
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
//     m_new[i] = max(m[i], maxⱼ Sᵀ[j][i])                 (vertical: vectorised over i; AVX-512
//                                                          lazily: only past m[i] + 8·ln 2, kRescaleAbove)
//     α[i]     = 2^((m[i] − m_new[i])·log2 e)
//     Pᵀ[j][i] = 2^((Sᵀ[j][i] − m_new[i])·log2 e);   l[i] = α[i]·l[i] + Σⱼ Pᵀ[j][i]
//     Oᵀ[d][i] = α[i]·Oᵀ[d][i] + Σⱼ V[j][d]·Pᵀ[j][i]       ← Oᵀ: (Dv, queries)
//   O[i][d] = Oᵀ[d][i] / l[i];   lse[i] = m[i] + ln l[i]   (l = 0: O = 0, lse = −inf;
//                                                          l NaN: O and lse NaN)
// With few tasks for the machine's cores, a task's keys are split into chunks run as separate
// items and merged per task afterwards (flash_key_splits.hpp); with keys that outgrow the L2, a
// few consecutive query blocks of a head take turns over the keys, a pass of key blocks each,
// so each K/V tile is read from memory once for them (flash_query_groups.hpp).
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
// the tensor; the conversion costs Nb·D loads per key block against Nb·D·Mb FMAs, and a group
// of tasks (flash_query_groups.hpp) converts each key block once for all of them.
//
// ── Where the FLOPs go (per visible (query, key) pair) ──────────────────────────────
//   Q·Kᵀ: Dk FMAs (micro-kernel qk, AVX2: 6 keys × 16 queries = 12 ymm accumulators; per d:
//         2 vector loads of Qᵀ, 6 broadcasts of K, 12 FMAs. AVX-512: 8 keys × 32 queries =
//         16 zmm; per d: 2 loads, 8 broadcasts, 16 FMAs — or, two panels at once
//         (kOpsPanelPairs), 6 keys × 64 queries: 4 loads, 6 broadcasts, 24 FMAs)
//   P·V:  Dv FMAs (micro-kernel pv: the same tiles over head-dim rows; per key: 2 vector
//         loads of Pᵀ, 6 (8) broadcasts of V, 12 (16) FMAs; the AVX-512 pair 4, 6 and 24)
//   softmax: 1 max, 1 sub, exp2 (6 FMAs + ~6 other ops), 1 add  — per 8 pairs, i.e.
//         ≈ 15 vector ops against (Dk + Dv) FMAs: ≈ 12 % extra at D = 64, 6 % at 128.
//         (AVX-512, per 16 pairs: the max in qk's store, one FMA, exp2 in 9, 1 add: ≈ 12 —
//         in most blocks all of them in qk's store, key_block's speculative block.)
//   counted (the benchmark's formula): 2·Dk + 2·Dv FLOPs per pair = 4·D.
//
// ── Tiles ────────────────────────────────────────────────────────────────────────────
// Register tile 6 × 16 (AVX2): 12 accumulators + 2 panel vectors + 1 broadcast = 15 of 16 ymm;
// 8 × 32 (AVX-512): 16 + 2 of 32 zmm, and 6 × 64 over two panels (24 + 4 + 1). Panel width and
// rows are Ops::kPanel / Ops::kRows (Ops::kPairRows).
// Mb (queries per task) = Nb (keys per block) = 64 (flash_default_tiles; 128 × 256 on AMX tiles): Qᵀ, Sᵀ and Oᵀ
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
// (all or none; flash_avx512.cpp's Avx512Bf16Ops does, with bf16 pairs for vdpbf16ps, and
// AmxBf16Ops over it, with the same pairs padded to AMX tiles):
//   scratch_bytes(p, t)           bytes of per-thread scratch it needs (Workspace::extra)
//   pack_q(p, w, b, nq, panels)   its own packed Qᵀ into w.qt (which holds Mb·Dk floats)
//   qk_block(p, w, b, hk, panels, j0, nk, ldS, scale, as_stored)   Sᵀ of keys [j0, j0+nk), all
//                                 panels; as_stored: softmax_block follows with as_stored (nothing
//                                 reads Sᵀ between), so Sᵀ may hold what the Ops' softmax expects
//   v_rows(p, b, hk, j0, nk, vbuf, ldv)   V rows of the key block as float32 (nk × Dv)
//   softmax_block(p, w, ldS, nk, ncols, pack, keep_f32, as_stored)   the online softmax of the key
//                                 block (m, l, α as Ops::softmax); pack: it also leaves Pᵀ in its own form for
//                                 pv_block; keep_f32: Sᵀ must hold the float32 Pᵀ afterwards (dropout,
//                                 the non-finite and careful paths read it), else Sᵀ may be left as is;
//                                 as_stored: Sᵀ is as qk_block stored it (the score rule changed nothing)
//   pv_block(p, w, b, hk, j0, panels, nk, ldS, vp, ldv, acc, ldO, packed)  acc ← α·acc + V·Pᵀ: V
//                                 float32 rows vp, or vp = nullptr: keys [j0, j0+nk) of V read by
//                                 the Ops itself (the driver then calls v_rows only where it checks
//                                 V); packed: Pᵀ as softmax_block packed it, else from the float32 Sᵀ
// and, optionally (kOpsThreadScratch), thread_scratch_bytes(p, t): bytes of scratch all of a
// thread's tasks share — a group's too — zeroed once per call (Workspace::thread_extra).
// Without them the driver runs the float32 code below (pack_qt, tile_rows, Ops::qk, Ops::pv).
// Everything else (score rule, softmax, non-finite handling, outputs) sees float32 Sᵀ,
// Pᵀ and V rows either way.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

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
// The SIMD softmaxes take s·log2 e − U as one FMA below this |max| (flash_avx512.cpp says why).
inline constexpr float kFusedExponentBelow = 0x1p8f;
// The AVX-512 float32 softmax's lazy rescale (flash_avx512.cpp's softmax): a column's running max
// moves only when a key block raises it by more than this (natural units), so every weight
// stays ≤ 2^8 (to rounding; times the fused exponent's 2^r, |r| ≤ 2^-16). Not in the avx2 row:
// on this Sapphire Rapids it measured level to 1–2 % slower there (kernels-lab fwd-22).
inline constexpr float kRescaleAbove = 5.5451774f;  // 8·ln 2
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

// Whether Ops has a tile over two adjacent panels as well (AVX-512: 6 rows × 64 queries besides
// 8 × 32), reading the second panel's Qᵀ at qt + Dk·kPanel and its Sᵀ/Oᵀ columns at + kPanel:
// qk_pair and pv_pair take all rows of the pair at once — a key block's nk keys,
// qk_pair(qt, k, ldk, nk, Dk, c2, s, ldS, cmax, ex, ahead) (cmax: with kOpsColumnMax, the block's
// column maxima; ex: with kOpsSpeculate, the speculative block's softmax in the store, else null),
// and the Dv head-dim rows, pv_pair(p, ldP, v, ldv, nk, Dv, ot, ldO, alpha, ahead) (ahead: the next
// key block's lines, ahead->request() before each tile, or null: KvAhead) — tiling them themselves
// (one call per block and pair instead of one per 6-row tile: kernels-lab fwd-24); with
// kOpsFuseModifiers, qk_modified_pair takes Ops::kPairRows rows per call, as qk_modified. The
// driver runs a block's panels in pairs then, and an odd last panel alone; each element's FMA
// chain is the same either way.
template <class Ops>
inline constexpr bool kOpsPanelPairs = requires { Ops::kPairRows; };

// Whether Ops defines the operand hooks (see the header).
template <class Ops>
inline constexpr bool kOpsOwnOperands = requires { &Ops::qk_block; };
template <class Ops>
inline constexpr bool kOpsThreadScratch = requires { &Ops::thread_scratch_bytes; };
// Whether key_block hands the next key block's K/V lines to the products' tiles, a few before each
// (KvAhead, flash_operands.hpp), instead of asking for them all at once — and with them O's rows and
// the next task's Q rows (Workspace::out_lines, next_q_lines) — for tasks of two or more panels.
// flash_kv_ahead requests more often where they are spread (they cost little there). Two kinds of
// Ops do: kOpsPairRequests, pair tiles that read K and V themselves (AVX-512 float32: qk_pair and
// pv_pair take w.kv_next); kOpsOwnSpread, an Ops with its own operands whose qk_block and pv_block
// call w.kv_next->request() before each of their tiles, Ops::request_tiles(panels, nk, Dv) of them
// a key block (Ops::kSpreadRequests: the all-bf16 row, S3 +2-3 %, S8 +1-3 % per CPU-second on Zen 5,
// kernels-lab fwd-37; not the AMX row, whose tiles ask for nothing: all at once there).
template <class Ops>
inline constexpr bool kOpsPairRequests = kOpsPanelPairs<Ops> && !kOpsOwnOperands<Ops>;
template <class Ops>
inline constexpr bool kOpsOwnSpread = kOpsOwnOperands<Ops> && requires { requires Ops::kSpreadRequests; };
template <class Ops>
inline constexpr bool kOpsSpreadRequests = kOpsPairRequests<Ops> || kOpsOwnSpread<Ops>;
// The tiles a key block's products run, over which KvAhead shares its lines out.
template <class Ops>
inline int request_tiles(int panels, std::int64_t nk, std::int64_t Dv) {
    if constexpr (kOpsOwnSpread<Ops>) return Ops::request_tiles(panels, nk, Dv);
    else if constexpr (kOpsPairRequests<Ops>)
        return panels / 2 * static_cast<int>((nk + Ops::kPairRows - 1) / Ops::kPairRows + (Dv + Ops::kPairRows - 1) / Ops::kPairRows);
    else return 0;
}
// Whether Ops::qk and qk_pair also take Sᵀ's column maxima (AVX-512): w.colmax at the call's
// panel, and for qk whether it is the block's first call (qk_pair holds the whole block); Ops::softmax
// then takes w.colmax.
template <class Ops>
inline constexpr bool kOpsColumnMax = requires { Ops::kColumnMax; };
// Whether Ops can run a key block's softmax in qk's store against the max the block starts from
// (AVX-512 float32: qk_pair's ex, speculate_from, speculated; key_block says when). Not an Ops
// with its own operands, though it inherits the three (the bf16 rows derive from the float32
// one): its qk_block and softmax_block are its own, and a speculative float32 softmax there
// would add sums the block never made.
template <class Ops>
inline constexpr bool kOpsSpeculate = requires { &Ops::speculate_from; } && !kOpsOwnOperands<Ops>;

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

// The α of n columns for Ops::pv: null where every one is 1 (the running max stayed in each, as
// the lazy rescale keeps it in most blocks: Ops::softmax), so pv loads Oᵀ without the multiply —
// the same bits (1·x = x, NaN and ±inf included); else alpha.
inline const float* rescale_or_null(const float* alpha, int n) {
    // The bits of 1.0f, compared as integers: an OR of XORs vectorises (GCC left `!= 1.0f` a
    // scalar loop of compares, ≈ 2 % of pv's samples on S2); NaN differs too.
    constexpr std::uint32_t kOne = 0x3f800000u;
    std::uint32_t diff = 0;
    for (int c = 0; c < n; ++c) {
        std::uint32_t u;
        std::memcpy(&u, alpha + c, sizeof u);
        diff |= u ^ kOne;
    }
    return diff != 0 ? alpha : nullptr;
}

// Oᵀ (acc) ← α·Oᵀ + Σⱼ V[j]·Pᵀ[j] for all panels: V rows vp (row stride ldv), Pᵀ in w.s.
// (b, hk, j0): where the key block's V rows are, for an Ops that reads them itself (vp = nullptr).
// p_packed: the operand hooks' softmax_block packed Pᵀ (see the header). partial (key_block's: the
// mask rule ran on the columns' ranges): each panel adds only the keys it can see (panel_keys), the
// same bits.
template <class Ops>
void pv_tile(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk, std::int64_t j0, int nq,
             int panels, std::int64_t nk, int ldS, const float* vp, std::int64_t ldv, float* acc, int ldO,
             [[maybe_unused]] bool p_packed, bool partial) {
    if constexpr (kOpsOwnOperands<Ops>) {
        Ops::pv_block(p, w, b, hk, j0, panels, nk, ldS, vp, ldv, acc, ldO, p_packed);
        return;
    }
    auto keys_of = [&](int pn) { return partial ? panel_keys<Ops>(w, nq, pn, j0, nk) : nk; };
    // Panel pn's keys [k0, k1) alone (Ops::pv), al its α (null: 1 or applied already).
    auto one = [&](int pn, std::int64_t k0, std::int64_t k1, const float* al) {
        for (std::int64_t d = 0; d < p.Dv; d += Ops::kRows)
            Ops::pv(w.s + k0 * ldS + pn * Ops::kPanel, ldS, vp + k0 * ldv + d, ldv, static_cast<int>(k1 - k0),
                    static_cast<int>(imin(Ops::kRows, p.Dv - d)), acc + d * ldO + pn * Ops::kPanel, ldO, al);
    };
    for (int pn = 0; pn < panels;) {
        if constexpr (kOpsPanelPairs<Ops>) {
            if (pn + 2 <= panels) {  // two panels a call (kOpsPanelPairs), over the keys both see
                const std::int64_t n0 = keys_of(pn), n1 = keys_of(pn + 1), both = imin(n0, n1);
                if (both > 0) {
                    const float* al = rescale_or_null(w.alpha + pn * Ops::kPanel, 2 * Ops::kPanel);
                    Ops::pv_pair(w.s + pn * Ops::kPanel, ldS, vp, ldv, static_cast<int>(both), static_cast<int>(p.Dv),
                                 acc + pn * Ops::kPanel, ldO, al, w.kv_next);
                }
                // then each panel's keys past those (with its α where the pair did not run)
                for (int q = 0; q < 2; ++q) {
                    const std::int64_t n = q == 0 ? n0 : n1;
                    const float* al = both > 0 ? nullptr : rescale_or_null(w.alpha + (pn + q) * Ops::kPanel, Ops::kPanel);
                    if (n > both || al != nullptr) one(pn + q, both, n, al);
                }
                pn += 2;
                continue;
            }
        }
        one(pn, 0, keys_of(pn), rescale_or_null(w.alpha + pn * Ops::kPanel, Ops::kPanel));
        ++pn;
    }
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
// rows below ahead_end (KvAhead spread over the pair tiles, else prefetch_kv_rows; 0: none; see
// ahead_end). careful (finite.hpp): V's large entries go to bigot, scaled by 2^-64, and every key
// block takes the selecting path for non-finite entries. with_sinks: see start_rows. Returns whether ALiBi can zero a weight
// (key_block's alibi_zeros).
template <class Ops>
bool start_keys(const SdpaProblem& p, const FlashTiles& t, Workspace& w, std::int64_t b, int nq, int panels,
                std::int64_t ulo, std::int64_t uhi, bool careful, bool with_sinks) {
    start_rows(p, w, nq, panels * Ops::kPanel, with_sinks);
    w.speculate = w.spec_failed = false;  // (key_block: not on a task's first block)
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

// One key block of a task. shared (not on the careful path): the block's K/V rows as its group
// read them once (run_group), at least nk of them; null: the task reads its own.
template <class Ops>
void key_block(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, std::int64_t b,
               std::int64_t hk, int nq, int panels, std::int64_t j0, std::int64_t nk, std::int64_t ahead_end,
               bool careful, bool alibi_zeros, const KvTile* shared = nullptr) {
    const int ncols = panels * Ops::kPanel, ldS = t.Mb, ldO = t.Mb;
    const float scale = static_cast<float>(p.scale);
    bool partial = false;
    for (int c = 0; c < nq && !partial; ++c) partial = w.lo[c] > j0 || w.hi[c] < j0 + nk;
    // The next block's K/V lines: a few before each pair tile of this block's products (KvAhead;
    // Ops with pair tiles that read K and V themselves), else all at once.
    KvAhead spread;  // (value 2: none)
    if (j0 + nk < ahead_end) {
        const std::int64_t j1 = imin(ahead_end, j0 + nk + t.Nb);
        bool all_at_once = true;
        if constexpr (kOpsSpreadRequests<Ops>) {
            if (panels >= 2) {
                spread.start(p, b, hk, j0 + nk, j1, request_tiles<Ops>(panels, nk, p.Dv));
                w.kv_next = &spread;
                all_at_once = false;
            }
        }
        if (all_at_once) prefetch_kv_rows(p, b, hk, j0 + nk, j1);
    } else if constexpr (kOpsPairRequests<Ops>) {
        // Nothing to ask for ahead and the head within the L2: this block's V rows' first lines
        // into the L1 during qk_pair's tiles, where pv_pair reads V in place (KvAhead::start_v_heads
        // says why; past the L2, a group's later tasks lost with them).
        if (panels >= 2 && shared == nullptr && !careful && p.paged == nullptr &&
            p.v.dtype() == DType::f32 && p.v.stride(3) == 1 && head_kv_bytes(p) <= kFlashCachedKvBytes) {
            spread.start_v_heads(p, b, hk, j0, j0 + nk, static_cast<int>((nk + Ops::kPairRows - 1) / Ops::kPairRows));
            w.kv_next = &spread;
        }
    }
    // This task's O rows (the block before its last: accumulate_keys) and the Q rows of the task the
    // thread runs next (its last block: run_flash), shared out over this block's pair tiles with the
    // cursor's own lines; a block without the cursor leaves them (accumulate_keys then asks for O's
    // rows at once before the last block; the next Q rows go unrequested).
    if constexpr (kOpsSpreadRequests<Ops>) {
        if (w.kv_next != nullptr && (w.out_lines.rows > 0 || (w.last_block && w.next_q_lines.rows > 0))) {
            spread.add(w.out_lines, w.last_block ? w.next_q_lines : RowLines{}, request_tiles<Ops>(panels, nk, p.Dv));
            w.out_lines.rows = 0;
            if (w.last_block) w.next_q_lines.rows = 0;
        }
    }
    // The score rule changes nothing in Sᵀ: the softmax sees it as qk_block stored it, and the
    // column maxima qk found hold.
    const bool as_stored = !partial && !p.has_elementwise_mask() && !p.has_score_modifiers();
    // Speculative (kOpsSpeculate): from a task's second key block on, where the score rule changes
    // nothing and one pair of panels holds the block, qk's store runs the softmax against the
    // running max the block starts from (qk_pair's ex) — no pass over Sᵀ. Where every column's max
    // stays (the lazy rescale keeps it in most blocks), that is the softmax's own result, bit for
    // bit; else the block runs again as usual, and the task stops speculating (at most one block
    // of qk twice per task, whatever the scores).
    bool softmaxed = false;
    if constexpr (kOpsSpeculate<Ops>) {
        if (as_stored && !careful && panels == 2 && w.speculate &&
            Ops::speculate_from(w.m, w.spec, ncols)) {
            score_tile<Ops>(p, w, b, hk, nq, panels, j0, nk, ldS, scale, partial, ScoreStage::masked, shared, as_stored,
                            w.spec);
            softmaxed = Ops::speculated(w.m, w.l, w.alpha, w.colmax, w.spec, ncols);
            w.spec_failed = !softmaxed;
        }
        w.speculate = !careful && !w.spec_failed;  // the next block: m is set where a key was seen
    }
    if (!softmaxed)
        score_tile<Ops>(p, w, b, hk, nq, panels, j0, nk, ldS, scale, partial, ScoreStage::masked, shared, as_stored);

    // Zeros of P only where a mask, ALiBi (a score that overflows to −inf: alibi_zeros) or
    // dropout ran: V is checked there (finite.hpp). Softcap keeps every score finite.
    const bool check = partial || p.has_elementwise_mask() || alibi_zeros || drop.active;
    // The operand hooks' softmax packs Pᵀ for pv_block unless dropout changes it first, and
    // keeps the float32 Pᵀ only for the paths that read it (dropout, checks, careful).
    const bool p_packed = kOpsOwnOperands<Ops> && !drop.active;
    if constexpr (kOpsOwnOperands<Ops>) {
        Ops::softmax_block(p, w, ldS, static_cast<int>(nk), ncols, p_packed, careful || check, as_stored);
    } else if (!softmaxed) {  // (a speculative block's softmax ran in qk's store)
        if constexpr (kOpsColumnMax<Ops>)
            Ops::softmax(w.s, ldS, static_cast<int>(nk), ncols, w.m, w.l, w.alpha, as_stored ? w.colmax : nullptr);
        else
            Ops::softmax(w.s, ldS, static_cast<int>(nk), ncols, w.m, w.l, w.alpha);
    }
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
        pv_tile<Ops>(p, w, b, hk, j0, nq, panels, nk, ldS, w.vbig, ldv, w.bigot, ldO, p_packed, partial);
    } else {
        ldv = 0;
        if constexpr (kOpsOwnOperands<Ops>)  // float32 rows only to check them; else the Ops reads V
            vp = check ? Ops::v_rows(p, b, hk, j0, nk, w.vbuf, ldv) : nullptr;
        else if (shared != nullptr)
            vp = shared->v, ldv = shared->ldv;
        else
            vp = kv_tile_rows<Ops>(p, true, b, hk, j0, nk, p.Dv, w.vbuf, ldv, panels);
        select = check && any_nonfinite(vp, ldv, nk, p.Dv);
        if (select) {
            if (vp != w.vbuf)  // rows in place (view or page) or the group's: copied, the zeros are this task's
                for (std::int64_t j = 0; j < nk; ++j) std::memcpy(w.vbuf + j * p.Dv, vp + j * ldv, sizeof(float) * static_cast<std::size_t>(p.Dv));
            for (std::int64_t e = 0; e < nk * p.Dv; ++e)
                if (nonfinite_f32(w.vbuf[e])) w.vbuf[e] = 0.0f;
            vp = w.vbuf;
            ldv = p.Dv;
        }
    }
    pv_tile<Ops>(p, w, b, hk, j0, nq, panels, nk, ldS, vp, ldv, w.ot, ldO, p_packed, partial);
    if (select) add_nonfinite_v<Ops>(p, w, b, hk, j0, nk, ncols, ldS, ldO);
    if (w.kv_next != nullptr) {  // what the tiles did not ask for (fewer or no pair calls: hidden keys, modifiers)
        spread.rest();
        w.kv_next = nullptr;
    }
}

// Where a task's key loop (keys below uhi) stops requesting each next key block's K/V rows
// (key_block: KvAhead or prefetch_kv_rows): at uhi when its tiles come from memory (kv_ahead: TaskGrid
// says when) or it has one panel (its micro-kernels reuse each line too little to hide even a
// cache's latency: 1.45-1.5x measured, docs/kernels-lab.md, "Requesting the next key block"); else 0.
inline std::int64_t ahead_end(bool kv_ahead, int panels, std::int64_t uhi) { return kv_ahead || panels == 1 ? uhi : 0; }

// The whole key loop of one task: (m, l, Oᵀ) of the block's columns from keys [ulo, uhi).
// kv_ahead: see ahead_end.
template <class Ops>
void accumulate_keys(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace& w, std::int64_t b,
                     std::int64_t hk, int nq, int panels, std::int64_t ulo, std::int64_t uhi, bool careful,
                     bool kv_ahead, bool with_sinks = true) {
    const bool alibi_zeros = start_keys<Ops>(p, t, w, b, nq, panels, ulo, uhi, careful, with_sinks);
    const std::int64_t ahead = ahead_end(kv_ahead, panels, uhi);
    // O's rows are stored next (prefetch_out_rows) unless this is a key chunk's partial (with_sinks
    // false: merge_block stores O) or the careful pass (the first pass asked already).
    const bool out_next = with_sinks && !careful;
    bool out_asked = false;  // O's rows spread over the block before the last
    for (std::int64_t j0 = ulo; j0 < uhi; j0 += t.Nb) {
        const bool last = j0 + t.Nb >= uhi;
        // Where the pair tiles spread their requests, O's rows go a few before each tile of the block
        // before the last (out_row_lines says why); else all at once before the last block.
        bool spread_out = false;
        if constexpr (kOpsSpreadRequests<Ops>)
            spread_out = out_next && panels >= 2 && !last && j0 + 2 * t.Nb >= uhi && out_row_lines(p, w, b, nq, w.out_lines);
        if (out_next && last && !out_asked) prefetch_out_rows(p, w, b, nq);  // before the last key block
        w.last_block = out_next && last;
        key_block<Ops>(p, t, drop, w, b, hk, nq, panels, j0, imin(t.Nb, uhi - j0), ahead, careful, alibi_zeros);
        if (spread_out) out_asked = w.out_lines.rows == 0;  // (key_block took them: it had the cursor)
        w.out_lines.rows = 0;
    }
    w.last_block = false;
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

}  // namespace attn::detail::ATTN_FLASH_NS

// The ways tasks run — in groups, in key chunks — and the call that schedules them; each file
// says what it holds.
#include "flash_query_groups.hpp"
#include "flash_key_splits.hpp"
#include "flash_schedule.hpp"
