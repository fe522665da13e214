// Groups of query blocks (flash_query_group: long key ranges): run_group.
// A part of the flash forward driver: flash_driver.hpp (which says what an Ops is) includes it
// after the per-task code it uses (run_block and its steps), in each ISA file's namespace.
#pragma once

#ifndef ATTN_FLASH_NS
#error "include flash_driver.hpp, not flash_query_groups.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

// A task streams every K and V row it can see; when a head's K and V are larger than the
// caches hold (Lk in the tens of thousands), each task reads them from memory again and the
// products wait for it. A group runs n consecutive tasks of one (b, KV head) — query blocks of
// one query head, or of the heads that share the KV head (GQA) — over their keys in passes of
// `pass` keys (flash_group_pass; whole key blocks): pass 0 of task 0, of task 1, …, then the next
// pass, so the rows are read from memory once for the n tasks and then from the L2 (each task's
// Qᵀ, Sᵀ and Oᵀ stay in its own workspace, its (m, l, Oᵀ) carried there from pass to pass). Each
// task's own steps and their order are run_block's, so the bits are too, whatever the pass. The
// passes need every task's key blocks to start at the same key: a group whose tasks' visible
// ranges start apart (a sliding window) runs task by task.
// shared_tiles: the problem's plan says its groups make the K/V rows once (JobPlan::group_tiles;
// then ws[0] holds the group tiles, one key block: the passes are one block long).
template <class Ops>
void run_group(const SdpaProblem& p, const FlashTiles& t, const Dropout& drop, Workspace* const* ws, const TaskAt* a,
               int n, bool shared_tiles, std::int64_t pass) {
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
    // A block's K/V rows that are not read in place (16-bit: converted; strided, paged) are made
    // once for the group, in the thread's group tiles (Workspace::gk/gv), and every task reads
    // them (KvTile): converting them per task cost the mixed-dtype rows 6-20 % (docs/kernels-lab.md,
    // "Mixed dtypes"). All tasks see one (b, KV head); each reads a prefix of the block's rows.
    // Only for a problem that needs it: the thread's tiles may be there for another of the batch.
    const Workspace& g = *ws[0];
    const bool apart = rows_apart(p);  // float32 rows that lie apart are copied too
    if (shared_tiles) pass = t.Nb;  // the group tiles hold one key block
    // Whether an earlier task of the group reads block j0 and requests the next one.
    auto requested_before = [&](int i, std::int64_t j0) {
        for (int e = 0; e < i; ++e)
            if (j0 >= k[e].ulo && j0 < k[e].uhi && ahead_end(a[e].kv_ahead, k[e].panels, k[e].uhi) > imin(j0 + t.Nb, k[e].uhi))
                return true;
        return false;
    };
    for (std::int64_t c0 = ulo; c0 < uhi; c0 += pass) {
        const std::int64_t c1 = imin(uhi, c0 + pass);
        KvTile tile;
        if (shared_tiles) {  // (pass = Nb: the block c0)
            const std::int64_t nk = imin(t.Nb, uhi - c0);
            tile.k = kv_tile_rows<Ops>(p, false, a[0].b, a[0].hk, c0, nk, p.Dk, g.gk, tile.ldk, k[0].panels, apart);
            tile.v = kv_tile_rows<Ops>(p, true, a[0].b, a[0].hk, c0, nk, p.Dv, g.gv, tile.ldv, k[0].panels, apart);
        }
        for (int i = 0; i < n; ++i)
            for (std::int64_t j0 = c0; j0 < imin(c1, k[i].uhi); j0 += t.Nb) {
                if (j0 < k[i].ulo) continue;
                const std::int64_t nk = imin(t.Nb, k[i].uhi - j0);
                const std::int64_t ahead = requested_before(i, j0) ? 0 : ahead_end(a[i].kv_ahead, k[i].panels, k[i].uhi);
                if (j0 + nk >= k[i].uhi) prefetch_out_rows(p, *ws[i], a[i].b, k[i].nq);  // its last block
                key_block<Ops>(p, t, drop, *ws[i], a[i].b, a[i].hk, k[i].nq, k[i].panels, j0, nk, ahead, false,
                               alibi_zeros[i], shared_tiles ? &tile : nullptr);
            }
    }
    for (int i = 0; i < n; ++i) finish_task<Ops>(p, t, drop, *ws[i], a[i], k[i]);
}

}  // namespace attn::detail::ATTN_FLASH_NS
