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
// with the scale split between dS and the stored dQ, dK (split_scale, backward_plan.hpp, says why).
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
// Code map: Plan (backward_plan.hpp: the call's facts — shape, how each operand is read, the
// split) → run_task (here: one task) → prepare_head (query_heads.hpp: its query heads' operands,
// once per task), pack_key_block (key_blocks.hpp: once per key block, Plan::pass blocks at a
// time) and run_tile (tile_call.hpp: one kBr × kBc tile, the kernel table's tile of tile.hpp),
// the tiles requesting rows ahead (row_requests.hpp), then store_key_block (key_blocks.hpp) and
// with several chunks the dQ partials' sum (dq_partials.hpp); a thread's buffers and their
// sizing: backward_scratch.hpp; operands.hpp reads and packs the rows; flash_backward (here)
// runs the tasks over the threads.
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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "../../core/allocate.hpp"
#include "../../core/element_io.hpp"
#include "../../core/float_env.hpp"
#include "../../core/parallel_for.hpp"
#include "../dispatch.hpp"
#include "../isa.hpp"
#include "../store_row.hpp"
#include "backward.hpp"
#include "operands.hpp"
#include "tile.hpp"

// The driver's parts, one concept each (the code map above); each includes the parts it uses.
#define ATTN_BACKWARD_DRIVER
#include "backward_plan.hpp"
#include "backward_scratch.hpp"
#include "query_heads.hpp"
#include "key_blocks.hpp"
#include "tile_call.hpp"
#include "row_requests.hpp"
#include "dq_partials.hpp"

namespace attn::detail {
namespace {

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
        for (std::int64_t i = i0; i < i1; ++i) std::fill_n(own_dq_row(c, s, b, h0 + static_cast<std::int64_t>(g), g, i), c.Dk, 0.0f);
    }
    if (c.dq_own && !c.dq_direct)  // this task owns these dQ rows: round them out once
        for (std::size_t g = 0; g < c.group; ++g)
            for (std::int64_t i = 0; i < c.Lq; ++i)
                store_row(bp.dq, bp.dq.offset(b, h0 + static_cast<std::int64_t>(g), i, 0), bp.dq.stride(3),
                          own_dq_row(c, s, b, h0 + static_cast<std::int64_t>(g), g, i), 1, c.Dk, c.split.grads);
    else if (c.dq_direct && c.split.grads != 1.0f)  // the caller's rows hold the sums: scale them once
        for (std::int64_t h = h0; h < h0 + p.group; ++h)
            for (std::int64_t i = 0; i < c.Lq; ++i) {
                float* row = bp.dq.data_as<float>() + bp.dq.offset(b, h, i, 0);
                for (std::int64_t d = 0; d < c.Dk; ++d) row[d] *= c.split.grads;
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
