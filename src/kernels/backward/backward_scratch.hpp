// A thread's buffers (Scratch): the task's Q and dO rows (HeadRows), the pass's key blocks
// (KeyBlock), the tiles' scratch; and their sizing for a call (size_scratch, scratch_bytes).
// A part of the backward driver: only flash_backward.cpp includes it, and like the rest of the
// driver it has internal linkage (anonymous namespace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../../core/allocate.hpp"
#include "backward_plan.hpp"

#ifndef ATTN_BACKWARD_DRIVER
#error "include backward_scratch.hpp from flash_backward.cpp only"
#endif

namespace attn::detail {
namespace {

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

// Row i of query head h (the g-th of the task's group, batch b) of the dQ sums a task owns (one
// chunk: Plan::dq_own): the caller's float32 rows (Plan::dq_direct) or the task's buffer dqb.
float* own_dq_row(const Plan& c, Scratch& s, std::int64_t b, std::int64_t h, std::size_t g, std::int64_t i) {
    return c.dq_direct ? c.bp.dq.data_as<float>() + c.bp.dq.offset(b, h, i, 0)
                       : s.dqb.data() + g * c.q.head + static_cast<std::size_t>(i * c.Dkp);
}

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

}  // namespace
}  // namespace attn::detail
