// The rows the tiles' S and dP products request ahead (RowsAhead, tile.hpp): the next query
// tile's Q and dO rows (next_rows), the next pass's K and V rows (next_keys) and the rows of the
// task a thread takes next (next_task), spread over the pass's tiles (SlicedRows, pass_tiles).
// A part of the backward driver: only flash_backward.cpp includes it, and like the rest of the
// driver it has internal linkage (anonymous namespace).
#pragma once

#include <algorithm>
#include <cstdint>

#include "backward_scratch.hpp"
#include "tile.hpp"
#include "tile_call.hpp"

#ifndef ATTN_BACKWARD_DRIVER
#error "include row_requests.hpp from flash_backward.cpp only"
#endif

namespace attn::detail {
namespace {

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

}  // namespace
}  // namespace attn::detail
