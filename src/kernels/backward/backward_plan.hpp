// The backward's plan of a call (Plan): the tile sizes, the scale split (split_scale), the shape,
// how each operand is read, the split into tasks and which rows the tiles request ahead.
// A part of the backward driver: only flash_backward.cpp includes it, and like the rest of the
// driver it has internal linkage (anonymous namespace).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "../../core/allocate.hpp"
#include "../../core/dropout.hpp"
#include "../../core/threads.hpp"
#include "../isa.hpp"
#include "../scores.hpp"  // before kNegInf below, which would shadow its templates' own
#include "backward.hpp"
#include "operands.hpp"
#include "tile.hpp"

#ifndef ATTN_BACKWARD_DRIVER
#error "include backward_plan.hpp from flash_backward.cpp only"
#endif

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

// Key blocks per pass over a head's query tiles, at most (Plan::pass): each query tile meets
// them while its Q, dO and dQ rows are in the L1/L2, so a pass streams those rows once per 128
// keys. S3's rows (6 MiB per head) do not fit Sapphire Rapids' 2 MiB L2: one block per pass ran
// ≈ 5 % slower per FLOP than L2-sized rows there (kernels-lab.md#bwd-6). A query tile adds to its
// dQ rows block by block in key order either way, and each block's dK/dV sums its tiles in the
// same order: the same bits for any pass width.
constexpr int kKeyBlocksPerPass = 2;

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

}  // namespace
}  // namespace attn::detail
