// The call: problems → tasks → items over OpenMP threads (TaskGrid, JobPlan, run_flash).
// A part of the flash forward driver: flash_driver.hpp (which says what an Ops is) includes it
// last, after the ways a task runs (run_group, run_chunk, merge_block), in each ISA file's namespace.
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "../../core/allocate.hpp"
#include "../../core/float_env.hpp"
#include "../../core/interrupt.hpp"
#include "flash_item_ranges.hpp"

#ifndef ATTN_FLASH_NS
#error "include flash_driver.hpp, not flash_schedule.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

// How one problem splits into tasks. Blocks: Mb queries of one head; or, when Lq < Mb
// (decode, short queries), all Lq queries of up to Mb / Lq heads that share a KV head
// (GQA/MQA), so the 16-lane panels are not mostly padding and each K/V tile read serves every
// head of the group.
struct TaskGrid {
    std::int64_t qpb = 0, hpb = 0, qblocks = 0, hchunks = 0, tasks = 0;
    std::int64_t kv_tasks = 0;  // tasks per (b, KV head): hchunks · qblocks, consecutive in task order
    bool kv_ahead = false;      // the tasks' K/V tiles come from the L3 or memory: flash_kv_ahead
};


template <class Ops>
TaskGrid task_grid(const SdpaProblem& p, const FlashTiles& t) {
    TaskGrid g;
    g.qpb = p.Lq >= t.Mb ? t.Mb : p.Lq;                   // queries per block
    g.hpb = imax(1, imin(p.group, t.Mb / g.qpb));         // heads per block
    g.qblocks = (p.Lq + g.qpb - 1) / g.qpb;
    g.hchunks = (p.group + g.hpb - 1) / g.hpb;
    g.kv_tasks = g.hchunks * g.qblocks;
    g.tasks = p.B * p.Hkv * g.kv_tasks;
    g.kv_ahead = flash_kv_ahead(g.kv_tasks, head_kv_bytes(p), kOpsSpreadRequests<Ops>);
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
    bool group_tiles = false;      // its groups make each key block's K/V rows once for their tasks
    std::int64_t pass = 0;         // keys per pass of its groups (flash_group_pass; run_group)
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

// The Q rows of item `item` (none past `end`) into rows, where the item is one whole task of one
// query head with float32 Q rows whose head dim is contiguous; else rows.rows = 0. run_flash asks
// for the rows of the item the thread runs next, during its current task's last key block: the Qᵀ
// pack had waited on each of them from the L3 (S6's attention 4 % of its samples, S1 2 %; asked for
// during the last block, S6 +2.5 %, S1 +1 % per CPU-second on Sapphire Rapids, docs/kernels-lab.md fwd-32).
// With each thread's own range of items the next item is known (the range's front) until the range
// is empty; under the dynamic schedule (the fallback) it is a guess: item + team size (the items go
// out in turn while their tasks take alike long). A wrong guess costs 256 requests at D = 64.
// Into the L1 (prefetcht0; the L2 until 2026-12-07): the pack reads them right after the last block,
// and from the L2 it still waited on them on Zen 5 — S6's attention +0.5 % (1 thread) and +0.3 %
// (2 threads) per CPU-second, S1–S4 level; level either way on Sapphire Rapids (fwd-34;
// docs/kernels-lab.md, fwd-39).
inline void next_task_q_lines(const JobPlan* plans, std::int64_t nw, const FlashJob* jobs, std::int64_t item,
                              std::int64_t end, RowLines& rows) {
    rows.rows = 0;
    if (item >= end) return;
    const std::int64_t i = job_of(plans, nw, &JobPlan::first_item, item);
    const JobPlan& j = plans[i];
    if (j.chunks != 1 || j.group != 1) return;
    const SdpaProblem& p = *jobs[i].p;
    if (p.q.dtype() != DType::f32 || p.q.stride(3) != 1) return;
    const TaskAt a = task_at(p, j.g, item - j.first_item);
    if (a.nh != 1) return;
    rows.row = static_cast<const char*>(p.q.data()) + p.q.offset(a.b, a.h0, a.i0, 0) * std::int64_t{sizeof(float)};
    rows.step = p.q.stride(2) * std::int64_t{sizeof(float)};
    rows.per_row = static_cast<int>((p.Dk * std::int64_t{sizeof(float)} + 63) / 64);
    rows.at = 0;
    rows.rows = a.nq_head;
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
    // malloc, not std::vector: see the note at the top of flash_driver.hpp. plans[n] holds the totals.
    JobPlan* plans = static_cast<JobPlan*>(std::malloc(sizeof(JobPlan) * static_cast<std::size_t>(n + 1)));
    if (plans == nullptr) throw_out_of_memory(static_cast<std::int64_t>(sizeof(JobPlan)) * (n + 1), "the flash kernel's plan");
    bool pack_k = false, group_tiles = false;
    int max_group = 1;
    std::size_t extra = 0, thread_extra = 0;
    const std::int64_t sf = slot_floats(*jobs[0].p, t);  // the same head dims in every problem
    JobPlan sum;
    for (std::int64_t i = 0; i < n; ++i) {
        const SdpaProblem& p = *jobs[i].p;
        JobPlan& j = plans[i];
        j = sum;
        j.g = task_grid<Ops>(p, t);
        j.chunk = flash_key_chunk(j.g.tasks, p.Lk, t.Nb, sf, t.key_splits);
        j.chunks = j.chunk > 0 ? (p.Lk + j.chunk - 1) / j.chunk : 1;
        const std::int64_t kv_heads = p.B * p.Hkv;
        // (the operand hooks read their own operands, per task: nothing for a group to share)
        const bool converts = !kOpsOwnOperands<Ops> && (converts_tiles(p) || rows_apart(p));
        j.group = j.chunks > 1 ? 1
                               : flash_query_group(kv_heads, j.g.kv_tasks, head_kv_bytes(p),
                                                   (p.Dk + p.Dv) * t.Mb * static_cast<std::int64_t>(sizeof(float)), t.query_group,
                                                   converts, 0, !kOpsOwnOperands<Ops>);
        j.group_items = (j.g.kv_tasks + j.group - 1) / j.group;
        sum.first_item += j.chunks > 1 ? j.g.tasks * j.chunks : kv_heads * j.group_items;
        max_group = j.group > max_group ? j.group : max_group;
        if (j.chunks > 1) {
            sum.first_slot += j.g.tasks * j.chunks;
            sum.first_merge += j.g.tasks;
        }
        // paged: tiles across pages; one-panel tasks of large heads copy their tiles (pack_tile_rows)
        pack_k = pack_k || p.paged != nullptr || !in_place(p.k, p.Dk) || pack_tile_rows(p, 1);
        // a group whose tiles are not read in place makes them once for its tasks (run_group):
        // decided per problem, so a batch's problems read in place beside one that converts
        // (the operand hooks read their own operands: nothing for a group to share)
        j.group_tiles = !kOpsOwnOperands<Ops> && j.group > 1 && (p.paged != nullptr || converts_tiles(p) || rows_apart(p));
        group_tiles = group_tiles || j.group_tiles;  // a thread's first workspace holds the tiles
        // measured on the float32 operands only: the operand hooks' groups (bf16 compute) keep one
        // key block a pass, the lockstep
        j.pass = kOpsOwnOperands<Ops>
                     ? t.Nb
                     : flash_group_pass(p.Dk * static_cast<std::int64_t>(dtype_size(p.k.dtype())) +
                                            p.Dv * static_cast<std::int64_t>(dtype_size(p.v.dtype())),
                                        t.Nb, t.group_pass);
        if constexpr (kOpsOwnOperands<Ops>) extra = extra > Ops::scratch_bytes(p, t) ? extra : Ops::scratch_bytes(p, t);
        if constexpr (kOpsThreadScratch<Ops>)
            thread_extra = thread_extra > Ops::thread_scratch_bytes(p, t) ? thread_extra : Ops::thread_scratch_bytes(p, t);
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
            throw_out_of_memory(static_cast<std::int64_t>(sizeof(float)) * wave_slots * sf, "the flash kernel's key-split partials");
        }
    }
    const int nthreads = threads > 0 ? threads : omp_get_max_threads();
    // One word a thread (flash_item_ranges.hpp); null: the dynamic schedule, which needs no memory.
    ItemRange* range_words = static_cast<ItemRange*>(
        std::aligned_alloc(alignof(ItemRange), sizeof(ItemRange) * static_cast<std::size_t>(nthreads)));
    std::int64_t failed_bytes = 0;  // a thread's workspaces that could not be allocated (0: none)
    const Interrupt interrupt;      // the caller's flag: tasks and merges left are skipped once it is set
    for (std::int64_t i0 = 0, i1; i0 < n && failed_bytes == 0 && !interrupt.requested(); i0 = i1) {
        i1 = wave_end(i0);
        const JobPlan& a = plans[i0];
        const JobPlan& z = plans[i1];
        const std::int64_t items = z.first_item - a.first_item, nw = i1 - i0;
        // Each thread's contiguous range of the items (flash_item_ranges.hpp); else (no memory for the
        // words, or a wave of 2^31 items) the dynamic schedule.
        ItemRanges ranges;
        ranges.r = range_words;
        ranges.first = a.first_item;
        const bool use_ranges = range_words != nullptr && items < ItemRanges::kMaxItems;
#pragma omp parallel num_threads(nthreads) if (items > 1)
        {
            const IeeeSubnormals ieee;  // each thread with IEEE subnormals (core/float_env.hpp)
            // Once per thread, before the task loop: one workspace per task of a group.
            alignas(Workspace) unsigned char raw[kMaxQueryGroup][sizeof(Workspace)];
            Workspace* ws[kMaxQueryGroup] = {};
            bool failed = false;
            for (int g = 0; g < max_group; ++g) {
                ws[g] = new (raw[g]) Workspace(*jobs[0].p, t, pack_k, extra, g == 0 && group_tiles, g == 0 ? thread_extra : 0);
                failed = failed || ws[g]->block == nullptr;
                ws[g]->thread_extra = ws[0]->thread_extra;  // (the first workspace's, for all)
            }
            Workspace& w = *ws[0];
            if (failed) {
                std::int64_t asked = 0;  // (only the first workspace holds the group's tiles and thread_extra)
                for (int g = 0; g < max_group; ++g) asked += static_cast<std::int64_t>(ws[g]->bytes);
#pragma omp atomic write
                failed_bytes = asked;
            }
            const int tid = omp_get_thread_num();
            ItemRanges mine = ranges;  // (the team can be smaller than nthreads)
            mine.team = omp_get_num_threads();
            if (use_ranges) mine.set_own(tid, items);
            // No task starts before every thread has its workspaces: when one thread's
            // allocation failed, no thread writes an output (the call fails whole; in the rare
            // batch of several waves, a later wave's failure leaves the earlier waves' problems
            // written).
#pragma omp barrier
            std::int64_t any_failed = 0;
#pragma omp atomic read
            any_failed = failed_bytes;
            failed = any_failed != 0;
            // One item: `next` is the item this thread runs after it, if known (else z.first_item).
            auto run_item = [&](std::int64_t item, std::int64_t next) {
                if (failed || interrupt.requested()) return;
                const std::int64_t i = i0 + job_of(plans + i0, nw, &JobPlan::first_item, item);
                const JobPlan& j = plans[i];
                const SdpaProblem& p = *jobs[i].p;
                const std::int64_t k = item - j.first_item;
                if (j.chunks == 1) {  // item k: a group of the tasks of (b, KV head) k / group_items
                    const std::int64_t r = k % j.group_items, first = (k / j.group_items) * j.g.kv_tasks + r * j.group;
                    const int count = static_cast<int>(imin(j.group, j.g.kv_tasks - r * j.group));
                    TaskAt at[kMaxQueryGroup];
                    for (int g = 0; g < count; ++g) at[g] = task_at(p, j.g, first + g);
                    w.next_q_lines.rows = 0;
                    if constexpr (kOpsSpreadRequests<Ops>) {
                        if (count == 1) {
                            // A task of another head than this thread's previous one reads its K/V
                            // from the L3 (its first here): it requests each next key block, as a head
                            // past the L2 does — spread over the tiles they cost little (S6's attention
                            // +0.7 %, docs/kernels-lab.md fwd-32).
                            if (at[0].b != w.prev_b || at[0].hk != w.prev_hk || w.prev_p != &p) at[0].kv_ahead = true;
                            w.prev_p = &p;
                            w.prev_b = at[0].b;
                            w.prev_hk = at[0].hk;
                            next_task_q_lines(plans + i0, nw, jobs + i0, next, z.first_item, w.next_q_lines);
                        }
                    }
                    run_group<Ops>(p, t, jobs[i].drop, ws, at, count, j.group_tiles, j.pass);
                } else {  // item k: chunk k % chunks of task k / chunks
                    const std::int64_t c0 = (k % j.chunks) * j.chunk, slot = j.first_slot - a.first_slot + k;
                    run_chunk<Ops>(p, t, jobs[i].drop, w, task_at(p, j.g, k / j.chunks), c0, imin(p.Lk, c0 + j.chunk),
                                   partials + slot * sf);
                }
            };
            if (use_ranges) {
                for (std::int64_t item = mine.take(tid); item >= 0; item = mine.take(tid)) {
                    const std::int64_t next = mine.own_next(tid);
                    run_item(item, next >= 0 ? next : z.first_item);
                }
#pragma omp barrier
            } else {
#pragma omp for schedule(dynamic, 1)
                for (std::int64_t item = a.first_item; item < z.first_item; ++item)
                    run_item(item, item + omp_get_num_threads());  // (a guess: the items go out in turn)
            }
            // (the barrier above or the omp for's: every partial is written before a merge reads it)
#pragma omp for schedule(dynamic, 1)
            for (std::int64_t m = a.first_merge; m < z.first_merge; ++m) {
                if (failed || interrupt.requested()) continue;  // (a skipped chunk left its partial unwritten)
                const std::int64_t i = i0 + job_of(plans + i0, nw, &JobPlan::first_merge, m);
                const JobPlan& j = plans[i];
                const SdpaProblem& p = *jobs[i].p;
                const std::int64_t task = m - j.first_merge, slot = j.first_slot - a.first_slot + task * j.chunks;
                merge_block<Ops>(p, t, jobs[i].drop, w, task_at(p, j.g, task), partials + slot * sf, j.chunks);
            }
            for (int g = 0; g < max_group; ++g) ws[g]->~Workspace();
        }
    }
    std::free(range_words);
    std::free(partials);
    std::free(plans);
    if (failed_bytes != 0) throw_out_of_memory(failed_bytes, "the flash kernel's workspace of one thread");
    interrupt.throw_if_requested();
}

}  // namespace attn::detail::ATTN_FLASH_NS
