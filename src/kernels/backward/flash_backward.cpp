// Tiled fp32 backward of attention (FlashAttention-2's algorithm, on CPU threads).
// Q, K, V, O, dO may be float32, float16 or bfloat16: they are widened to float32 as they
// are packed (K/V once per key block, Q/dO once per task for its query heads: a per-thread
// buffer of group·Lq rows, never a whole-tensor copy); dQ, dK, dV accumulate in float32 and
// are rounded once to their own dtype when stored.
//
// For each tile of query rows i and keys j it recomputes, never storing Lq×Lk:
//   P  = exp(S·scale + bias − lseᵢ)         S = Q·Kᵀ, lse saved by the forward
//   dP = dO·Vᵀ (∘ Z/(1−p) with dropout)     Dᵢ = rowsum(dO ∘ O), computed once
//   dS = P ∘ (dP − Dᵢ)
//   dV += P̂ᵀ·dO,  dK += scale·dSᵀ·Q,  dQ += scale·dS·K
// with the scale split between dS and the stored dQ, dK (split_scale says why).
//
// Work split (deterministic): one task = (batch, KV head, chunk of key blocks). A task
// owns the dK/dV rows of its key blocks, summing over the query heads of its GQA group
// in a fixed order, so no two tasks write the same dK/dV row. dQ gets contributions from
// every key block: with one chunk (B·Hkv >= 8 on up to 2 CPUs) a task owns all dQ rows of its
// heads and accumulates them itself; otherwise each chunk accumulates into its own dQ partial,
// and the partials are added in chunk order at the end. The chunk count depends on the shape
// and the machine's CPU count (backward_chunks), never on the thread count, so the result is
// bit-identical for any thread count and schedule.
//
// Code map: Plan (the call's facts: shape, how each operand is read, the split) → run_task
// (one task) → prepare_head (its query heads' operands, once per task), pack_key_block (once
// per key block, Plan::pass blocks at a time: KeyBlock) and run_tile (one kBr × kBc tile: the
// kernel table's tile, tile.hpp); operands.hpp reads and packs the rows.
//
// Tiles that the structural masks (causal, window, key lengths) hide completely are
// skipped; tiles they cover completely, with no element-wise rule, run without the score
// rule (scores.hpp), which the others apply to each row through a callback.
//
// Non-finite values (kernels/finite.hpp): where P (or dS) is exactly 0 — a masked key, a
// row with no visible key, a dropped weight — the products below must select, not
// multiply. dS·K and dSᵀ·Q run on copies of K and Q with NaN/±inf entries 0: a key
// (query) holding one has a NaN or ±inf score wherever it is visible, so its P, hence dS,
// is NaN or 0 there — zeroing changes no product that is not 0·x. P̂ᵀ·dO runs on a copy
// of dO with those entries 0 and the tile adds each back where P̂ is not 0. dO·Vᵀ needs
// nothing: dS = P∘(dP − D) is 0 wherever P is 0 (ds_row selects).
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <tuple>
#include <utility>
#include <vector>

#include <omp.h>

#include "../../core/allocate.hpp"
#include "../../core/dropout.hpp"
#include "../../core/element_io.hpp"
#include "../../core/float_env.hpp"
#include "../../core/parallel_for.hpp"
#include "../../core/threads.hpp"
#include "../finite.hpp"
#include "../isa.hpp"
#include "../scores.hpp"
#include "../simd/convert.hpp"
#include "../store_row.hpp"
#include "backward.hpp"
#include "../dispatch.hpp"
#include "operands.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

constexpr int kBr = 64;  // query rows per tile
constexpr int kBc = 64;  // keys per tile (a multiple of 4: dropout draws 4 keys per Philox call)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int round8(std::int64_t x) { return static_cast<int>((x + 7) / 8 * 8); }
// Query tiles (kBr rows, the last may be short) of a head's Lq rows.
std::size_t query_tiles(std::int64_t Lq) { return static_cast<std::size_t>((Lq + kBr - 1) / kBr); }

// scale = ds·grads: the tiles multiply dS by ds, the driver dQ and dK by grads as it stores
// them. dS = scale·P∘(dP − D) is a float32 value (bf16 compute: rounded to bf16, whose
// subnormals vdpbf16ps reads as 0), so a tiny scale made it subnormal: dQ = dK = 0 on bf16
// compute at scale 2e-38, bits lost in float32. Below 2^-63 dS carries 2^-63 and the
// stored gradients scale·2^63 (a power of two: exact), so dS is normal down to
// |P∘(dP − D)| = 2^-63 and the sums dS·K, dSᵀ·Q are the gradients times 2^-63/scale ≤ 2^63:
// they overflow only where a gradient exceeds FLT_MAX·2^63·scale (3.7·10¹⁹ at scale 2^-126).
// A huge scale made dS overflow instead: inf past |P∘(dP − D)| = FLT_MAX/scale (2 at 2^127),
// then inf or NaN gradients where the double reference's are finite (Q and K of order 2^-66).
// Above 2^63, the mirror image: dS carries 2^63 and the stored gradients scale·2^-63, so dS
// is finite up to |P∘(dP − D)| = 2^65 and the sums are the gradients times 2^63/scale > 2^-65:
// subnormal only where a gradient is below 2^-126·2^-63·scale (2^-62 at scale 2^127).
// From 2^-63 to 2^63 (and 0) dS carries the whole scale, as it always did: the sums are the
// gradients themselves, no new overflow and the same bits for every usual scale.
struct ScaleSplit {
    float ds, grads;
};
ScaleSplit split_scale(float scale) {
    const float floor = 0x1p-63f, ceiling = 0x1p63f;
    const float magnitude = std::fabs(scale);
    if (scale == 0.0f || (magnitude >= floor && magnitude <= ceiling)) return {scale, 1.0f};
    if (magnitude < floor) return {floor, scale * 0x1p63f};
    return {ceiling, scale * 0x1p-63f};
}

// Σ a[d]·b[d] in double: 8 partial sums (d mod 8) added in a fixed order, so the compiler
// vectorises it and the result depends on n only.
double dot_f64(const float* a, const float* b, std::int64_t n) {
    double acc[8] = {};
    std::int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(a[d + l]) * static_cast<double>(b[d + l]);
    for (int l = 0; d < n; ++d, ++l) acc[l] += static_cast<double>(a[d]) * static_cast<double>(b[d]);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// The Q rows, or the dO rows, of the task's query heads (group × Lq rows of width Dp each):
// what the tiles read for them, per head g of the group.
struct HeadRows {
    // Widened to float32 when not read in place: packed once per task and read by every key
    // block, so the conversion costs 1/Lk of the tile work; z only when a head holds a NaN/±inf.
    CacheLineVector<float> f32, z;
    // bf16 compute only: the rows as bf16 and as row pairs (the latter from the zeroed rows).
    CacheLineVector<std::uint16_t> b16;
    CacheLineVector<std::uint32_t> pairs;
    std::vector<char> nonfinite;  // head g holds a NaN/±inf
    // Head g's float32 rows for S and dP (the caller's or f32) and for dK/dV (z when the head
    // holds a NaN/±inf, else the same), their row strides; bf16 compute: its bf16 rows (the
    // caller's or b16) and their row stride.
    std::vector<const float*> at, z_at;
    std::vector<std::ptrdiff_t> ld, z_ld;
    std::vector<const std::uint16_t*> at16;
    std::vector<std::ptrdiff_t> ld16;
    std::size_t task_bytes() const { return 4 * (f32.capacity() + z.capacity() + pairs.capacity()) + 2 * b16.capacity(); }
};

// Key blocks per pass over a head's query tiles, at most (Plan::pass): each query tile meets
// them while its Q, dO and dQ rows are in the L1/L2, so a pass streams those rows once per 128
// keys. S3's rows (6 MiB per head) do not fit Sapphire Rapids' 2 MiB L2: one block per pass ran
// ≈ 5 % slower per FLOP than L2-sized rows there (kernels-lab.md#bwd-6). A query tile adds to its
// dQ rows block by block in key order either way, and each block's dK/dV sums its tiles in the
// same order: the same bits for any pass width.
constexpr int kKeyBlocksPerPass = 2;

// One key block's operands and gradient sums (pack_key_block, run_tile).
struct KeyBlock {
    std::int64_t j0 = 0;
    int bc = 0, bcp = 0;
    // dk and dv hold no sum yet: the first tile that reaches the block stores its products
    // there (TileArgs::dkv_first) instead of a zeroing pass adding to zeros (bwd-8); a block no
    // tile reaches is zeroed before it is stored.
    bool unwritten = true;
    CacheLineVector<float> kt, vt, kp, dk, dv;
    // bf16 compute only: Kᵀ/Vᵀ/K pairs of the key block (tile.hpp, TileBf16).
    CacheLineVector<std::uint32_t> ktp, vtp, kpp;
};

struct Scratch {
    KeyBlock key[kKeyBlocksPerPass];
    CacheLineVector<float> vrow, S, dP, Pd, drop, drow, cg;
    HeadRows q, dO;          // the task's Q and dO rows
    CacheLineVector<float> dqb;  // the task's dQ rows (group × Lq, width Dkp) when it owns them (one chunk)
    // With one chunk, per query tile of the task's heads (group × ⌈Lq/kBr⌉): its dQ rows hold no
    // sum yet (TileArgs::dq_first; zeroed at the task's end if no tile reached them).
    std::vector<char> dq_unwritten;
    // bf16 compute only: the tile's P̂/dS scratch (tile.hpp, TileBf16).
    CacheLineVector<std::uint16_t> ds16;
    CacheLineVector<std::uint32_t> pp;
    // Bytes held by the per-task buffers (the ones that grow with Lq).
    std::size_t task_bytes() const { return q.task_bytes() + dO.task_bytes() + 4 * dqb.capacity(); }
    // Per row of the task's heads (group × Lq): −lse (−inf for a row with no visible key)
    // and D = rowsum(dO ∘ O); w: one row of dO and O widened when not read in place.
    std::vector<float> nl, dd;
    CacheLineVector<float> w;
};

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


// The call's facts that every task reads: the shape, how each operand is read, the split.
struct Plan {
    const BackwardProblem& bp;
    const SdpaProblem& p;
    const KernelSet& kernels;
    std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    int Dkp, Dvp;
    Dropout drop;
    float scale;
    ScaleSplit split;                   // scale = split.ds (in dS) · split.grads (on dQ, dK)
    bool bf16;                          // products on bf16 pairs (backward_compute is not f32)
    void (*tile)(const TileArgs&);      // the kernel table's tile for that
    std::int64_t Lq2;                   // query row pairs per head (bf16 compute)
    // How Q, and dO, are read: in place when they are float32 rows of the padded width, else
    // widened per task (widen_rows). A head whose rows hold a NaN/±inf gets a copy with those
    // entries 0 for dSᵀ·Q and P̂ᵀ·dO (see the top), made by the task (finite_rows).
    struct RowsPlan {
        const TensorView* t;
        int Dp;              // padded row width (Dkp for Q, Dvp for dO)
        std::size_t head;    // floats of one head's rows (Lq·Dp)
        Rows in_place;       // valid when direct
        bool direct;         // float32 rows of width Dp, read in place
        bool bf16_direct;    // bf16 compute: bf16 rows read in place where finite (checked per head)
        const char* zeroed_copy;  // what the copy with NaN/±inf entries 0 is, for an out-of-memory message
    } q, dO;
    std::size_t group;   // query heads per KV head
    std::vector<std::int64_t> lo, hi;    // visible key interval of every query row (b·Lq + i)
    // Chunks of key blocks per (b, KV head) when B·Hkv is small: backward_chunks.
    std::int64_t nkb, nchunks, tasks;
    // With one chunk a task owns every dQ row of its query heads: it accumulates them in
    // the caller's float32 rows (the first tile to reach them stores, no zeroing pass) or in a
    // per-thread buffer rounded out at the task's end. Only several chunks need the shared
    // partials (B·Hq·Lq·Dkp floats per chunk, 32 MiB on S3: allocating and faulting them in
    // cost ~8 % of S1).
    bool dq_own, dq_direct;
    std::size_t dq_part;
    // Key blocks per pass: 2 on the avx512 row, whose tile eats the rows fastest (S3 +6 %); 1 on
    // the others, where the second block's operands cost more than the stream saved (the avx2
    // row 1–2 % slower on S1 and S3, Sapphire Rapids: kernels-lab.md#bwd-6).
    int pass;
    // The S and dP products request the next query tile's Q and dO rows (RowsAhead) when a pass
    // streams more rows than the L2 holds — its heads' Q, dO and dQ rows: S3's 6 MiB, not S1's
    // 768 KiB (there the requests cost ≈ 1 %, B1 H16 L1024 D128's 1.5 MiB level; S3 ≈ +3 %:
    // kernels-lab.md#bwd-9). The float32 avx512 tile only: the others take no requests. Only
    // requests depend on the L2's size, never a result.
    bool rows_ahead;
    // The S and dP products request the next pass's K and V rows (next_keys), the float32 avx512
    // tile only: the first read of each pass's rows was the transposes' (kernels-lab.md#bwd-10).
    bool keys_ahead;
    // A task's last pass requests the rows of the task its thread takes next (next_task) where
    // both tasks' Q, dO and O rows fit the L2 together (S1: 2 × 768 KiB), the same tile only:
    // S1 +1.2–1.3 % per CPU-second on 1 and 2 threads (kernels-lab.md#bwd-10).
    bool task_ahead;
    // dK and dV are written by non-temporal stores (stream_rows) where they are float32 rows of
    // whole lines and more than the L2 holds (S1: 8 MiB): written once, never read here, so the
    // ordinary stores' read of each line first was waste — store_row's stall on its stores, 1.2 %
    // of S1's backward; S1 +0.8 %, S3 +0.3 % per CPU-second (kernels-lab.md#bwd-11). Smaller
    // outputs stay in the caches for whoever reads them next. Only how the rows are written
    // depends on the L2's size, never a value.
    bool stream_dkv;

    Plan(const BackwardProblem& bp_, const KernelSet& k)
        : bp(bp_), p(bp_.fwd), kernels(k), B(p.B), Hq(p.Hq), Hkv(p.Hkv), Lq(p.Lq), Lk(p.Lk), Dk(p.Dk), Dv(p.Dv),
          Dkp(round8(Dk)), Dvp(round8(Dv)), drop(p.dropout()), scale(static_cast<float>(p.scale)), split(split_scale(scale)) {
        const Compute compute = backward_compute(k, bp);
        bf16 = compute != Compute::f32;  // both bf16 tiles read the same TileBf16 operands
        tile = compute == Compute::bf16_amx ? k.backward_tile_amx : bf16 ? k.backward_tile_bf16 : k.backward_tile;
        Lq2 = (Lq + 1) / 2;
        for (auto [r, t, Dp, zeroed_copy] :
             {std::tuple{&q, &p.q, Dkp, "the flash backward's copy of a task's Q rows with their NaN/±inf entries 0 (one per thread)"},
              std::tuple{&dO, &bp.grad_out, Dvp,
                         "the flash backward's copy of a task's grad_out rows with their NaN/±inf entries 0 (one per thread)"}}) {
            r->t = t;
            r->zeroed_copy = zeroed_copy;
            r->Dp = Dp;
            r->head = static_cast<std::size_t>(Lq * Dp);
            r->direct = direct_rows(*t, Dp, r->in_place);
            r->bf16_direct = bf16 && bf16_rows_in_place(*t, Dp);
        }
        group = static_cast<std::size_t>(p.group);
        // B·Lq entries each (1 GiB for 2^26 rows): a refusal names them, not a bare std::bad_alloc.
        resize_or_throw(lo, B * Lq, "the flash backward's first visible key of every query row");
        resize_or_throw(hi, B * Lq, "the flash backward's end of the visible keys of every query row");
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t i = 0; i < Lq; ++i) {
                const KeyRange kr = p.key_range(b, i);
                lo[static_cast<std::size_t>(b * Lq + i)] = kr.lo;
                hi[static_cast<std::size_t>(b * Lq + i)] = kr.hi;
            }
        nkb = (Lk + kBc - 1) / kBc;
        dq_part = static_cast<std::size_t>(B * Hq * Lq * Dkp);
        nchunks = backward_chunks(B * Hkv, nkb, static_cast<std::int64_t>(dq_part), split_target(8));
        tasks = B * Hkv * nchunks;
        dq_own = nchunks == 1;
        dq_direct = dq_own && bp.dq.dtype() == DType::f32 && bp.dq.stride(3) == 1 && Dk == Dkp;
        pass = k.isa == Isa::avx512 ? kKeyBlocksPerPass : 1;
        const std::int64_t streamed = static_cast<std::int64_t>(group) * Lq * (2 * Dkp + Dvp) * 4;
        rows_ahead = k.isa == Isa::avx512 && !bf16 && streamed > cpu_features().l2_bytes;
        keys_ahead = k.isa == Isa::avx512 && !bf16;
        stream_dkv = B * Hkv * Lk * (Dk + Dv) * 4 > cpu_features().l2_bytes;
        task_ahead = keys_ahead && 2 * static_cast<std::int64_t>(group) * Lq * (Dkp + 2 * Dvp) * 4 <= cpu_features().l2_bytes;
    }

};

// A thread's buffers sized for this call (kept from call to call: see flash_backward).
// Sizes a thread's Scratch and counts the bytes it asks for; count_only: counts, sizes nothing
// (scratch_bytes). One list of the buffers for both, so the out-of-memory message says what
// size_scratch really asks for.
struct ScratchSizer {
    bool count_only = false;
    std::size_t bytes = 0;
    template <class V>
    void resize(V& v, std::size_t n) {
        bytes += n * sizeof(typename V::value_type);
        if (!count_only) v.resize(n);
    }
    template <class V>
    void zeroed(V& v, std::size_t n) {
        bytes += n * sizeof(typename V::value_type);
        if (!count_only) v.assign(n, typename V::value_type{});
    }
};

void size_scratch(const Plan& c, Scratch& s, ScratchSizer& z) {
    const int Bcp = round8(kBc);
    const std::size_t group = c.group;
    for (int u = 0; u < c.pass; ++u) {
        KeyBlock& k = s.key[u];
        z.zeroed(k.kt, static_cast<std::size_t>(c.Dk * Bcp));
        z.zeroed(k.vt, static_cast<std::size_t>(c.Dv * Bcp));
        z.zeroed(k.kp, static_cast<std::size_t>(kBc * c.Dkp));
        z.resize(k.dk, static_cast<std::size_t>(kBc * c.Dkp));
        z.resize(k.dv, static_cast<std::size_t>(kBc * c.Dvp));
        if (c.bf16) {
            z.resize(k.ktp, static_cast<std::size_t>((c.Dk + 1) / 2 * Bcp));
            z.resize(k.vtp, static_cast<std::size_t>((c.Dv + 1) / 2 * Bcp));
            z.resize(k.kpp, static_cast<std::size_t>((kBc + 1) / 2 * c.Dkp));
        }
    }
    z.resize(s.vrow, static_cast<std::size_t>(c.Dv));
    for (auto [o, r] : {std::pair{&s.q, &c.q}, std::pair{&s.dO, &c.dO}}) {
        if (!r->direct) z.zeroed(o->f32, group * r->head);
        z.zeroed(o->nonfinite, group);
        for (auto* v : {&o->at, &o->z_at}) z.resize(*v, group);
        for (auto* v : {&o->ld, &o->z_ld}) z.resize(*v, group);
        if (c.bf16) {
            z.resize(o->at16, group);
            z.resize(o->ld16, group);
            z.zeroed(o->b16, group * r->head);
            z.resize(o->pairs, group * static_cast<std::size_t>(c.Lq2 * r->Dp));
        }
    }
    z.resize(s.nl, group * static_cast<std::size_t>(c.Lq));
    z.resize(s.dd, group * static_cast<std::size_t>(c.Lq));
    z.resize(s.w, static_cast<std::size_t>(2 * c.Dv));
    for (auto* t : {&s.S, &s.dP, &s.Pd}) z.resize(*t, static_cast<std::size_t>(kBr * Bcp));
    if (c.p.softcap > 0.0) z.resize(s.cg, static_cast<std::size_t>(kBr * Bcp));
    z.resize(s.drop, static_cast<std::size_t>(kBr * Bcp));
    z.resize(s.drow, static_cast<std::size_t>(Bcp + 6));  // one row's whole Philox blocks (Dropout::fill_row)
    if (c.bf16) {
        z.resize(s.pp, static_cast<std::size_t>((kBr + 1) / 2 * Bcp));
        z.resize(s.ds16, static_cast<std::size_t>(kBr * Bcp));
    }
    if (c.dq_own && !c.dq_direct) z.resize(s.dqb, group * c.q.head);
    // (empty with several chunks: a kept buffer of an earlier call must not mark rows here)
    z.resize(s.dq_unwritten, c.dq_own ? group * query_tiles(c.Lq) : 0);
}

// The bytes size_scratch asks for on each thread.
std::size_t scratch_bytes(const Plan& c) {
    Scratch none;
    ScratchSizer z{true};
    size_scratch(c, none, z);
    return z.bytes;
}

// The rows of Q, or of dO, of query head g of the task's group (head h of batch b), once per
// task: in place, widened, the zeroed copy for a head holding a NaN/±inf, and for bf16 compute
// the bf16 rows and pairs (bf16 rows with no NaN/±inf read in place: no float32 copy at all).
// finite: the rows are known to hold no NaN/±inf (dO's, by D: prepare_head), so not scanned.
void prepare_rows(const Plan& c, const Plan::RowsPlan& r, HeadRows& o, std::int64_t b, std::int64_t h, std::size_t g,
                  bool finite = false) {
    const TensorView& t = *r.t;
    const std::int64_t Lq = c.Lq;
    const int Dp = r.Dp;
    const std::size_t head = r.head, total = c.group * head;
    std::uint32_t* pairs = c.bf16 ? o.pairs.data() + g * static_cast<std::size_t>(c.Lq2 * Dp) : nullptr;
    const std::uint16_t* in16 = r.bf16_direct ? t.data_as<const std::uint16_t>() + t.offset(b, h, 0, 0) : nullptr;
    if (in16 && any_nonfinite16(in16, t.stride(2), Lq, Dp, kBF16Exponent)) in16 = nullptr;
    o.at[g] = r.direct ? r.in_place.row(b, h, 0) : o.f32.data() + g * head;
    o.ld[g] = r.direct ? r.in_place.si : Dp;
    if (in16) {
        o.nonfinite[g] = 0;
        o.at16[g] = in16;
        o.ld16[g] = t.stride(2);
        bf16_pairs16(in16, t.stride(2), Lq, Dp, pairs, Dp);
    } else {
        if (!r.direct) widen_rows(t, b, h, Lq, Dp, o.f32.data() + g * head);
        if ((o.nonfinite[g] = !finite && any_nonfinite(o.at[g], o.ld[g], Lq, Dp))) {
            // Sized by the first head that needs it, inside the parallel region (most calls have
            // no NaN/±inf: no copy at all); a refusal is said after the region (flash_backward).
            if (o.z.size() < total) resize_or_throw(o.z, static_cast<std::int64_t>(total), r.zeroed_copy);
            finite_rows(o.at[g], o.ld[g], Lq, Dp, o.z.data() + g * head);
        }
    }
    o.z_at[g] = o.nonfinite[g] ? o.z.data() + g * head : o.at[g];
    o.z_ld[g] = o.nonfinite[g] ? Dp : o.ld[g];
    if (c.bf16 && !in16) {  // bf16 rows (for S, dP) and row pairs (for dK, dV: the zeroed copies)
        bf16_rows(o.at[g], o.ld[g], Lq, Dp, o.b16.data() + g * head, Dp);
        bf16_pairs(o.z_at[g], o.z_ld[g], Lq, Dp, pairs, Dp);
        o.at16[g] = o.b16.data() + g * head;
        o.ld16[g] = Dp;
    }
}

// Query head g of the task's group (head h of batch b), once per task: its Q and dO rows, and
// per row −lse and D = rowsum(dO ∘ O). The task of the first chunk also keeps D for the
// sinks' gradient.
void prepare_head(const Plan& c, Scratch& s, std::int64_t b, std::int64_t h, std::size_t g, std::int64_t chunk,
                  float* Dall) {
    const SdpaProblem& p = c.p;
    const std::int64_t Lq = c.Lq;
    // Per row: −lse (the float32 lse negated: exact; a row with no visible key −inf, +inf
    // lse −FLT_MAX as before: a visible +inf score keeps P = inf, others 0); the tile
    // subtracts it before scaling by log2 e (tile.hpp, kTileLog2e); D = rowsum(dO ∘ O) over
    // rows as float32 (exact; read in place when float32 with unit stride) summed in 8 fixed
    // double lanes.
    // D also scans dO: a NaN/±inf in a dO row makes its sum in double NaN or ±inf (x·±inf is
    // ±inf or NaN, and nothing brings a sum back from either), and products and sums of finite
    // float32 values stay finite in double (|Σ| ≤ Dv·FLT_MAX² ≪ DBL_MAX). So every D finite in
    // double (before its float32 rounding) means finite dO rows: prepare_rows skips their scan,
    // one read of the head's dO rows fewer (docs/kernels-lab.md#bwd-11).
    bool dO_finite = true;
    for (std::int64_t i = 0; i < Lq; ++i) {
        const std::size_t gi = g * static_cast<std::size_t>(Lq) + static_cast<std::size_t>(i);
        const double lse = load(*p.lse, p.lse->offset(b, h, i));
        const double nl = std::clamp(-lse, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX));
        s.nl[gi] = lse == -INFINITY ? kNegInf : static_cast<float>(std::isnan(lse) ? lse : nl);
        const double d = dot_f64(f32_row(c.bp.grad_out, b, h, i, s.w.data()), f32_row(p.out, b, h, i, s.w.data() + c.Dv), c.Dv);
        dO_finite = dO_finite && std::isfinite(d);
        s.dd[gi] = static_cast<float>(d);
        if (chunk == 0 && Dall != nullptr) Dall[static_cast<std::size_t>((b * c.Hq + h) * Lq + i)] = s.dd[gi];
    }
    prepare_rows(c, c.q, s.q, b, h, g);
    prepare_rows(c, c.dO, s.dO, b, h, g, dO_finite);
}

// Key block kb ([j0, j0 + bc)) of KV head hk packed for the tiles: Kᵀ and Vᵀ (d-major, keys
// contiguous, zero-padded to bcp) and K (key-major, padded to Dkp, NaN/±inf 0 for dS·K),
// from float32 rows in place or widened to float32 (convert.hpp); bf16 compute reads only their pairs, made from the bf16
// words (K and V are bf16 then).
void pack_key_block(const Plan& c, Scratch& s, KeyBlock& kb, std::int64_t b, std::int64_t hk) {
    const SdpaProblem& p = c.p;
    const std::int64_t j0 = kb.j0;
    const int bc = kb.bc, bcp = kb.bcp;
    if (c.bf16) {  // Kᵀ and Vᵀ pairs along d (for S, dP), K pairs along keys with NaN/±inf 0 (for dQ)
        const std::uint16_t* k16 = p.k.data_as<const std::uint16_t>() + p.k.offset(b, hk, j0, 0);
        const std::uint16_t* v16 = p.v.data_as<const std::uint16_t>() + p.v.offset(b, hk, j0, 0);
        bf16_pairs_t16(k16, p.k.stride(2), p.k.stride(3), bc, bcp, c.Dk, kb.ktp.data(), bcp);
        bf16_pairs_t16(v16, p.v.stride(2), p.v.stride(3), bc, bcp, c.Dv, kb.vtp.data(), bcp);
        bf16_pairs_z16(k16, p.k.stride(2), p.k.stride(3), bc, c.Dk, c.Dkp, kb.kpp.data(), c.Dkp);
        return;
    }
    const bool k_rows = p.k.dtype() == DType::f32 && p.k.stride(3) == 1;
    const bool v_rows = p.v.dtype() == DType::f32 && p.v.stride(3) == 1;
    if (k_rows) {  // float32 rows in place: Kᵀ by 4 × 4 blocks, K with NaN/±inf 0 (for dS·K)
        const float* k = p.k.data_as<const float>() + p.k.offset(b, hk, j0, 0);
        transpose_rows(k, p.k.stride(2), bc, c.Dk, kb.kt.data(), bcp);
        for (int j = 0; j < bc; ++j)
            finite_rows(k + j * p.k.stride(2), 0, 1, static_cast<int>(c.Dk), kb.kp.data() + static_cast<std::ptrdiff_t>(j) * c.Dkp);
    }
    if (v_rows)
        transpose_rows(p.v.data_as<const float>() + p.v.offset(b, hk, j0, 0), p.v.stride(2), bc, c.Dv, kb.vt.data(), bcp);
    for (int j = 0; j < (k_rows ? 0 : bc); ++j) {
        float* kr = kb.kp.data() + static_cast<std::ptrdiff_t>(j) * c.Dkp;
        widen_row(p.k, p.k.offset(b, hk, j0 + j, 0), p.k.stride(3), c.Dk, kr);
        for (std::int64_t d = 0; d < c.Dk; ++d) {
            kb.kt[static_cast<std::size_t>(d * bcp + j)] = kr[d];
            if (nonfinite_f32(kr[d])) kr[d] = 0.0f;  // for dS·K
        }
    }
    for (int j = 0; j < (v_rows ? 0 : bc); ++j) {
        widen_row(p.v, p.v.offset(b, hk, j0 + j, 0), p.v.stride(3), c.Dv, s.vrow.data());
        for (std::int64_t d = 0; d < c.Dv; ++d) kb.vt[static_cast<std::size_t>(d * bcp + j)] = s.vrow[static_cast<std::size_t>(d)];
    }
    for (int j = bc; j < bcp; ++j) {
        for (std::int64_t d = 0; d < c.Dk; ++d) kb.kt[static_cast<std::size_t>(d * bcp + j)] = 0.0f;
        for (std::int64_t d = 0; d < c.Dv; ++d) kb.vt[static_cast<std::size_t>(d * bcp + j)] = 0.0f;
    }
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
    if (c.dq_direct) {
        t.dq = c.bp.dq.data_as<float>() + c.bp.dq.offset(b, h, i0, 0);
        t.lddq = c.bp.dq.stride(2);
    } else {
        const std::size_t row0 = static_cast<std::size_t>((b * c.Hq + h) * Lq + i0);
        t.dq = c.dq_own ? s.dqb.data() + g * c.q.head + static_cast<std::size_t>(i0 * c.Dkp)
                        : dq_c + row0 * static_cast<std::size_t>(c.Dkp);
        t.lddq = c.Dkp;
    }
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

// Rows asked for a slice at a time by the current pass's last `slices` query tiles that run
// (RowsAhead): the next pass's K and V rows (next_keys), or in a task's last pass the task its
// thread takes next (next_task). Late in the pass, the pass streams little more through the L2
// (S3: ≤ 8 tiles' Q, dO and dQ rows, 768 KiB), and the lines are there when pack_key_block
// transposes them or prepare_head scans them (kernels-lab.md#bwd-10). Rows of a non-unit inner
// stride are left out.
struct SlicedRows {
    static constexpr int kTiles = 8;  // the query tiles that share the next pass's K/V requests
    RowsAhead::Range range[RowsAhead::kRanges];
    int ranges = 0;
    std::int64_t first = 0;  // the first requesting tile, counted over the pass's tiles that run
    int slices = 0;
    // Rows [i0, i0 + rows) of (b, h) of a (B, H, L, D) tensor (rows may run on into the next heads
    // when the tensor's heads lie one after the other).
    void add(const TensorView& x, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows) {
        if (x.stride(3) != 1 || rows <= 0) return;
        // Signed: a view's offsets may be negative (reversed dims), and an unsigned one wraps.
        const auto size = static_cast<std::int64_t>(dtype_size(x.dtype()));
        range[ranges++] = {static_cast<const char*>(x.data()) + x.offset(b, h, i0, 0) * size, x.stride(2) * size,
                           static_cast<int>(rows), static_cast<int>(x.dim(3) * size)};
    }
    // Adds slice t (the t-th tile that runs in the pass) of each range to `a`, if any.
    void add_slice(std::int64_t t, RowsAhead& a) const {
        if (t < first || t >= first + slices) return;
        const std::int64_t k = t - first;
        for (int r = 0; r < ranges; ++r) {
            const RowsAhead::Range& g = range[r];
            const int r0 = static_cast<int>(k * g.rows / slices), r1 = static_cast<int>((k + 1) * g.rows / slices);
            a.add(g.base + r0 * g.ld, g.ld, r1 - r0, g.row_bytes);
        }
    }
    // Spread over the last `tiles` (at most) of the pass's `run` tiles.
    void spread(std::int64_t run, std::int64_t tiles) {
        slices = ranges > 0 ? static_cast<int>(std::min(tiles, run)) : 0;
        first = run - slices;
    }
};

// The query tiles (g, i0) of the task's group that see keys [j0, j1): those that run in a pass.
std::int64_t pass_tiles(const Plan& c, std::int64_t b, std::int64_t j0, std::int64_t j1) {
    std::int64_t tiles = 0;
    for (std::int64_t i0 = 0; i0 < c.Lq; i0 += kBr) tiles += tile_sees(c, b, i0, j0, j1);
    return tiles * static_cast<std::int64_t>(c.group);
}

// The next pass's keys [j0, j1) of KV head hk in batch b, asked for by the last kTiles of the
// current pass's `run` tiles.
SlicedRows next_keys(const Plan& c, std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t j1, std::int64_t run) {
    SlicedRows k;
    if (!c.keys_ahead || j0 >= j1) return k;
    k.add(c.p.k, b, hk, j0, j1 - j0);
    k.add(c.p.v, b, hk, j0, j1 - j0);
    k.spread(run, SlicedRows::kTiles);
    return k;
}

// The rows task `task` reads first — its query heads' Q, dO and O rows (prepare_head) and its
// first pass's K and V rows — asked for by all the `run` tiles of the current task's last pass,
// where both tasks' rows fit the L2 together (Plan::task_ahead: S1).
SlicedRows next_task(const Plan& c, std::int64_t task, std::int64_t run) {
    SlicedRows k;
    if (!c.task_ahead || task >= c.tasks) return k;
    const std::int64_t chunk = task / (c.B * c.Hkv), b = task % (c.B * c.Hkv) / c.Hkv, hk = task % c.Hkv;
    const std::int64_t h0 = hk * c.p.group;
    for (const TensorView* x : {&c.p.q, &c.bp.grad_out, &c.p.out})  // the group's heads, when one block of rows
        k.add(*x, b, h0, 0, x->stride(1) == c.Lq * x->stride(2) ? static_cast<std::int64_t>(c.group) * c.Lq : c.Lq);
    const std::int64_t j0 = chunk * c.nkb / c.nchunks * kBc;
    const std::int64_t j1 = std::min<std::int64_t>(c.Lk, j0 + c.pass * kBc);
    k.add(c.p.k, b, hk, j0, j1 - j0);
    k.add(c.p.v, b, hk, j0, j1 - j0);
    k.spread(run, run);
    return k;
}

// The lines the S and dP products of a query tile request while it runs against the pass's
// `tiles` key blocks (RowsAhead), spread evenly over their row blocks: the Q and dO rows of the
// query tile from row i1 of head g (past the head's rows, or unless Plan::rows_ahead: none),
// then slice t of the rows the pass asks for ahead (SlicedRows).
RowsAhead next_rows(const Plan& c, const Scratch& s, std::size_t g, std::int64_t i1, int tiles, const SlicedRows& later,
                    std::int64_t t) {
    RowsAhead a;
    if (c.rows_ahead && i1 < c.Lq) {
        const int rows = static_cast<int>(std::min<std::int64_t>(kBr, c.Lq - i1));
        const HeadRows* head[] = {&s.q, &s.dO};
        const int Dp[] = {c.Dkp, c.Dvp};
        for (int r = 0; r < 2; ++r)
            a.add(head[r]->at[g] + i1 * head[r]->ld[g], 4 * head[r]->ld[g], rows, 4 * Dp[r]);
    }
    later.add_slice(t, a);
    const int blocks = 2 * tiles * ((kBr + 5) / 6);  // S and dP: 6-row blocks (tile_avx512_gemm.inl)
    a.per_block = (a.lines() + blocks - 1) / blocks;
    return a;
}

// The task's dK (times split.grads) and dV rows of key block kb, written once: streamed past the
// caches where Plan::stream_dkv and stream_rows allow (the task ends the streams:
// end_streams), else row by row (store_row).
void store_key_block(const Plan& c, const KeyBlock& kb, std::int64_t b, std::int64_t hk) {
    for (auto [t, src, ld, D, f] : {std::tuple{&c.bp.dk, kb.dk.data(), c.Dkp, c.Dk, c.split.grads},
                                    std::tuple{&c.bp.dv, kb.dv.data(), c.Dvp, c.Dv, 1.0f}}) {
        if (c.stream_dkv && t->dtype() == DType::f32 && t->stride(3) == 1 &&
            stream_rows(t->data_as<float>() + t->offset(b, hk, kb.j0, 0), t->stride(2), src, ld, kb.bc, D, f))
            continue;
        for (int j = 0; j < kb.bc; ++j) store_row(*t, t->offset(b, hk, kb.j0 + j, 0), t->stride(3), src + j * ld, 1, D, f);
    }
}

// One task: the key blocks of chunk `chunk` of KV head hk in batch b, against every query
// row of the heads sharing hk. It owns those keys' dK/dV rows, and with one chunk its heads'
// dQ rows; dq_ws holds the chunks' dQ partials otherwise.
// `next`: the tasks not yet taken; the task takes its thread's next one from it as its last pass
// starts (`following`, or −1 if it never got there) and asks for that task's rows meanwhile.
void run_task(const Plan& c, Scratch& s, std::int64_t task, float* dq_ws, float* Dall, std::atomic<std::int64_t>& next,
              std::int64_t& following) {
    const SdpaProblem& p = c.p;
    const BackwardProblem& bp = c.bp;
    // Chunk-major: under a causal mask (either alignment) the first key blocks are seen by the
    // most queries, so the longest tasks go first and the dynamic schedule ends on short ones.
    const std::int64_t chunk = task / (c.B * c.Hkv), b = task % (c.B * c.Hkv) / c.Hkv, hk = task % c.Hkv;
    const std::int64_t h0 = hk * p.group;
    float* dq_c = c.dq_own ? nullptr : dq_ws + static_cast<std::size_t>(chunk) * c.dq_part;
    // With one chunk the first tile of each query tile's rows stores its dQ there (run_tile):
    // no zeroing pass over the caller's rows or dqb.
    std::fill(s.dq_unwritten.begin(), s.dq_unwritten.end(), char{1});
    for (std::size_t g = 0; g < c.group; ++g)  // widen this task's Q and dO rows once
        prepare_head(c, s, b, h0 + static_cast<std::int64_t>(g), g, chunk, Dall);
    const std::int64_t kb_end = (chunk + 1) * c.nkb / c.nchunks;
    for (std::int64_t kb0 = chunk * c.nkb / c.nchunks; kb0 < kb_end; kb0 += c.pass) {
        const int n = static_cast<int>(std::min<std::int64_t>(c.pass, kb_end - kb0));
        for (int u = 0; u < n; ++u) {
            KeyBlock& kb = s.key[u];
            kb.j0 = (kb0 + u) * kBc;
            kb.bc = static_cast<int>(std::min<std::int64_t>(kBc, c.Lk - kb.j0));
            kb.bcp = round8(kb.bc);
            kb.unwritten = true;
            pack_key_block(c, s, kb, b, hk);
        }
        const std::int64_t pass_j1 = std::min<std::int64_t>(c.Lk, (kb0 + n) * kBc);
        const std::int64_t run = c.keys_ahead ? pass_tiles(c, b, kb0 * kBc, pass_j1) : 0;
        const bool last = kb0 + n >= kb_end;
        if (last) following = next.fetch_add(1);
        const std::int64_t next_j1 = std::min<std::int64_t>(c.Lk, std::min(kb_end, kb0 + n + c.pass) * kBc);
        const SlicedRows later = last ? next_task(c, following, run) : next_keys(c, b, hk, pass_j1, next_j1, run);
        std::int64_t t = 0;  // the pass's tiles that run, so far
        for (std::size_t g = 0; g < c.group; ++g)
            for (std::int64_t i0 = 0; i0 < c.Lq; i0 += kBr) {
                if (later.slices > 0 && !tile_sees(c, b, i0, kb0 * kBc, pass_j1)) continue;
                RowsAhead ahead = next_rows(c, s, g, i0 + kBr, n, later, t++);
                for (int u = 0; u < n; ++u)
                    run_tile(c, s, s.key[u], b, h0 + static_cast<std::int64_t>(g), g, i0, dq_c, &ahead);
            }
        // This task owns dK/dV rows j0..j0+bc of KV head hk.
        for (int u = 0; u < n; ++u) {
            KeyBlock& kb = s.key[u];
            if (kb.unwritten) {  // no query row sees these keys: their gradients are 0
                std::fill(kb.dk.begin(), kb.dk.end(), 0.0f);
                std::fill(kb.dv.begin(), kb.dv.end(), 0.0f);
            }
            store_key_block(c, kb, b, hk);
        }
    }
    if (c.stream_dkv) end_streams();  // the task's dK/dV rows are in memory before it is done
    // Query tiles no key block reached (every key hidden from their rows): dQ = 0.
    const std::size_t tiles = query_tiles(c.Lq);
    for (std::size_t e = 0; e < s.dq_unwritten.size(); ++e) {
        if (!s.dq_unwritten[e]) continue;
        const std::size_t g = e / tiles;
        const std::int64_t i0 = static_cast<std::int64_t>(e % tiles) * kBr, i1 = std::min<std::int64_t>(c.Lq, i0 + kBr);
        for (std::int64_t i = i0; i < i1; ++i) {
            float* row = c.dq_direct ? bp.dq.data_as<float>() + bp.dq.offset(b, h0 + static_cast<std::int64_t>(g), i, 0)
                                     : s.dqb.data() + g * c.q.head + static_cast<std::size_t>(i * c.Dkp);
            std::fill_n(row, c.Dk, 0.0f);
        }
    }
    if (c.dq_own && !c.dq_direct)  // this task owns these dQ rows: round them out once
        for (std::size_t g = 0; g < c.group; ++g)
            for (std::int64_t i = 0; i < c.Lq; ++i)
                store_row(bp.dq, bp.dq.offset(b, h0 + static_cast<std::int64_t>(g), i, 0), bp.dq.stride(3),
                          s.dqb.data() + g * c.q.head + static_cast<std::size_t>(i * c.Dkp), 1, c.Dk, c.split.grads);
    else if (c.dq_direct && c.split.grads != 1.0f)  // the caller's rows hold the sums: scale them once
        for (std::int64_t h = h0; h < h0 + p.group; ++h)
            for (std::int64_t i = 0; i < c.Lq; ++i) {
                float* row = bp.dq.data_as<float>() + bp.dq.offset(b, h, i, 0);
                for (std::int64_t d = 0; d < c.Dk; ++d) row[d] *= c.split.grads;
            }
}

// dQ row r (b·Hq·Lq + h·Lq + i) = Σ over the chunks' partials, in chunk order.
void sum_dq_row(const Plan& c, const float* dq_ws, std::int64_t r) {
    const std::int64_t b = r / (c.Hq * c.Lq), h = r / c.Lq % c.Hq, i = r % c.Lq;
    for (std::int64_t d = 0; d < c.Dk; ++d) {
        float acc = dq_ws[static_cast<std::size_t>(r * c.Dkp + d)];
        for (std::int64_t k = 1; k < c.nchunks; ++k)
            acc += dq_ws[static_cast<std::size_t>(k) * c.dq_part + static_cast<std::size_t>(r * c.Dkp + d)];
        store(c.bp.dq, c.bp.dq.offset(b, h, i, d), acc * c.split.grads);
    }
}

// Sinks: dσ_h = −Σ_{b,i} e^{σ_h − lse}·D (backward.hpp), summed in double in row order.
void sink_gradients(const Plan& c, const float* Dall) {
    for (std::int64_t h = 0; h < c.Hq; ++h) {
        const double sigma = c.p.sink(h);
        double acc = 0.0;
        for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t i = 0; i < c.Lq; ++i) {
                const double lse = load(*c.p.lse, c.p.lse->offset(b, h, i));
                const double d = Dall[static_cast<std::size_t>((b * c.Hq + h) * c.Lq + i)];
                if (d != 0.0) acc -= std::exp(sigma - lse) * d;
            }
        store(*c.bp.dsinks, c.bp.dsinks->offset(h), acc);
    }
}

// The dQ partials of a several-chunk call (B·Hkv < 8 on up to 2 CPUs), on the calling thread
// and kept for its next call as the tasks' buffers are, unless larger than 32 MiB: allocated per
// call they put page faults on every call (~8 % of a call's samples: kernels-lab.md#bwd-1). On
// 64-byte lines (the tiles' zmm loads and stores of dQ rows; a 16-byte-aligned `new float[]`
// split them) and, from 2 MiB, on advised huge pages (allocate_streamed). Contents undefined:
// the call zeroes them.
class DqPartials {
public:
    explicit DqPartials(std::size_t floats) {
        if (floats == 0) return;
        if (kept_.floats < floats) {
            kept_.release();
            kept_.p = static_cast<float*>(allocate_streamed(static_cast<std::int64_t>(sizeof(float) * floats),
                                                            "the flash backward's dQ partials (one per chunk of key blocks)"));
            kept_.floats = floats;
        }
        data_ = kept_.p;
    }
    ~DqPartials() {
        if (kept_.floats > kKeepFloats) kept_.release();
    }
    DqPartials(const DqPartials&) = delete;
    DqPartials& operator=(const DqPartials&) = delete;
    float* data() const { return data_; }

private:
    static constexpr std::size_t kKeepFloats = (std::size_t{32} << 20) / sizeof(float);
    struct Buffer {
        float* p = nullptr;
        std::size_t floats = 0;
        void release() {
            std::free(p);
            p = nullptr;
            floats = 0;
        }
        ~Buffer() { std::free(p); }
    };
    static thread_local Buffer kept_;
    float* data_ = nullptr;
};
thread_local DqPartials::Buffer DqPartials::kept_;

}  // namespace

// The target comes from the machine's CPU count (split_target), never the thread count, so the
// partials' sum order does not change with threads. S1 (B·Hkv = 16) on 64 CPUs: 16 chunks, 64 MiB
// of partials; S3: 8 chunks (the cap), 256 MiB; on 2 CPUs both run 1 chunk (docs/kernels.md,
// "Parallel split").
std::int64_t backward_chunks(std::int64_t bh, std::int64_t key_blocks, std::int64_t dq_part_floats, std::int64_t target) {
    constexpr std::int64_t kMaxPartialFloats = std::int64_t{64} << 20;  // 256 MiB
    const std::int64_t for_8_tasks = (8 + bh - 1) / bh, wanted = (target + bh - 1) / bh;
    const std::int64_t by_memory = kMaxPartialFloats / std::max<std::int64_t>(dq_part_floats, 1);
    return std::clamp<std::int64_t>(std::min(wanted, std::max(for_8_tasks, by_memory)), 1, std::max<std::int64_t>(key_blocks, 1));
}

std::string flash_backward_declines(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse, const TensorView& grad_out) {
    const auto ok = [](const TensorView& t) { return t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16; };
    if (!(ok(q) && ok(k) && ok(v) && ok(out) && ok(grad_out) && lse.dtype() == DType::f32))
        return "it needs q, k, v, out and grad_out in float32, float16 or bfloat16 and a float32 lse (float64 is the "
               "reference's)";
    return head_dims_decline(q.dim(q.rank() - 1), v.dim(v.rank() - 1));  // (…, D): 4-d, or packed 3-d
}

Compute backward_compute(const KernelSet& row, const BackwardProblem& bp) {
    const SdpaProblem& p = bp.fwd;
    const auto bf = [](const TensorView& t) { return t.dtype() == DType::bf16; };
    const bool bf16 = row.backward_tile_bf16 != nullptr && p.bf16_products && bf(p.q) && bf(p.k) && bf(p.v) &&
                      bf(p.out) && bf(bp.grad_out) && bf(bp.dq) && bf(bp.dk) && bf(bp.dv) && cpu_features().has_avx512_bf16();
    if (!bf16) return Compute::f32;
    return row.backward_tile_amx != nullptr && cpu_features().has_amx_bf16() ? Compute::bf16_amx : Compute::bf16_dot;
}

// q: (B, Hq, Lq, Dk), k: (B, Hkv, Lk, Dk), v: (B, Hkv, Lk, Dv), out/grad_out: (B, Hq, Lq, Dv), lse: (B, Hq, Lq)
void flash_backward(const BackwardProblem& bp, const KernelSet& kernels) {
    const Plan c(bp, kernels);
    // Each task computes −lse·log2 e and D = rowsum(dO ∘ O) of its own heads' rows: no pass of
    // its own over all rows, hence one parallel region and no barrier before the tasks (a
    // separate pass and its barrier were a per-call cost of the 2-thread call). The sinks'
    // gradient needs every row's D: the first chunk's task of each head copies its rows here.
    const std::int64_t nrows = c.B * c.Hq * c.Lq;
    std::vector<float> Dall;
    resize_or_throw(Dall, bp.dsinks ? nrows : 0, "the flash backward's D = rowsum(dO ∘ O) of every row (for the sinks)");
    const std::size_t dq_floats = c.dq_own ? 0 : c.dq_part * static_cast<std::size_t>(c.nchunks);
    const DqPartials partials(dq_floats);
    float* dq_ws = partials.data();
    // A buffer a thread cannot size is said after the region: an exception must not leave it
    // (std::terminate: a test under an address-space limit found it). The threads' buffers are
    // sized before any task runs (a refusal leaves the outputs untouched); a task's copy of rows
    // holding a NaN/±inf is sized by the task (prepare_rows): its refusal is kept by `task_error`,
    // the remaining tasks are skipped, and outputs the finished tasks wrote stay written.
    std::atomic<bool> scratch_refused{false};
    FirstError task_error;
    std::atomic<std::int64_t> untaken{0};  // the first task no thread has taken (run_task)

#pragma omp parallel
    {
        const IeeeSubnormals ieee;  // each thread with IEEE subnormals (core/float_env.hpp)
        // Per-thread buffers kept from call to call (as gemm.cpp's workspace): allocating
        // them afresh put page faults on every call — up to ~10 MB per thread on S3
        // (Q/dO rows of a task, the task's dQ), ~10 % of S1's bf16 backward.
        thread_local Scratch t_scratch;
        Scratch& s = t_scratch;
        try {
            ScratchSizer sizer;
            size_scratch(c, s, sizer);
        } catch (...) {  // std::bad_alloc, or length_error: nothing may leave the region
            s = Scratch{};
            scratch_refused.store(true);
        }
#pragma omp barrier
        if (!scratch_refused.load()) {  // the same branch on every thread: all or none run the loops
            // Each thread zeroes a slice of the dQ partials (first touch on the thread that uses it most).
            if (!c.dq_own) {
                const std::int64_t total = static_cast<std::int64_t>(c.dq_part) * c.nchunks;
#pragma omp for schedule(static)
                for (std::int64_t e = 0; e < total; e += 4096)
                    std::memset(dq_ws + e, 0, sizeof(float) * static_cast<std::size_t>(std::min<std::int64_t>(4096, total - e)));
            }

            // Tasks in order from one counter, as schedule(dynamic, 1) hands them out, except that a
            // thread takes its next task as its current one's last pass starts (run_task), to
            // request that task's rows; no result depends on which thread runs a task. (No barrier
            // after: with one chunk nothing follows that needs the other threads' tasks; with
            // several, the barrier below comes before the partials are summed.)
            for (std::int64_t task = untaken.fetch_add(1); task < c.tasks;) {
                std::int64_t following = -1;
                task_error.run([&] { run_task(c, s, task, dq_ws, bp.dsinks ? Dall.data() : nullptr, untaken, following); });
                task = following >= 0 ? following : untaken.fetch_add(1);
            }

            if (!c.dq_own) {
#pragma omp barrier
            }
            // dQ = Σ over chunks, in chunk order (one chunk: the tasks stored dQ).
            if (!c.dq_own) {
#pragma omp for schedule(static)
                for (std::int64_t r = 0; r < nrows; ++r)
                    if (!task_error.failed()) sum_dq_row(c, dq_ws, r);
            }
        }
        // Kept for the next call unless a long sequence made them large (32 MiB per thread) —
        // also when another thread's were refused: memory is short then.
        if (s.task_bytes() > (std::size_t{32} << 20)) s = Scratch{};
    }
    if (scratch_refused.load()) {
        // What each thread asked for: Q and dO rows copied to float32 (when not read in place) and
        // the task's dQ rows are the large part, the tiles add a little. (Counting the copied rows
        // alone said "cannot allocate 0 bytes" when Q and dO were read in place.)
        throw_out_of_memory(static_cast<std::int64_t>(scratch_bytes(c)),
                            "the flash backward's buffers of one thread (a task's Q, dO and dQ rows, and its tiles; "
                            "each thread needs as much)");
    }
    task_error.rethrow();
    if (bp.dsinks) sink_gradients(c, Dall.data());
}

}  // namespace attn::detail
