// The fused, tiled ("flash") forward kernel: O = softmax(Q·Kᵀ·scale + mask)·V without
// ever storing the Lq × Lk score matrix. See flash_driver.hpp for the algorithm, the
// tile sizes and where the FLOPs go; docs/kernels.md for the overview.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../../core/dropout.hpp"
#include "../isa.hpp"
#include "../../sdpa/problem.hpp"

namespace attn::detail {

// Tile sizes. A query block (Mb queries, a multiple of the 16-query panel) is one task
// for one thread; it walks the visible keys in blocks of Nb.
struct FlashTiles {
    int Mb = 64;
    int Nb = 64;
    // Key chunks per task (the lab and tests force a split with it); 0: flash_key_chunk decides.
    int key_splits = 0;
    // Tasks per group of query blocks (1 .. kMaxQueryGroup; the lab and tests force it); 0:
    // flash_query_group decides.
    int query_group = 0;
    // Keys per pass of a group over its keys (flash_group_pass: rounded up to whole key blocks; the
    // float32 operands only; the lab and tests force it); 0: flash_group_pass decides.
    int group_pass = 0;
};

// At most this many tasks (query blocks) run as one group (flash_query_groups.hpp). 8: at D = 64
// a group of 8 is every query block of a 512-query head (S4, S6's attention), so each head's K/V
// rows come from the L3 (S4) or are copied (S6, rows_apart) once instead of twice: +2.5-3 % per
// CPU-second on Sapphire Rapids (docs/kernels-lab.md, fwd-14); flash_query_group's bound on Qᵀ + Oᵀ
// (256 KiB or, float32, a quarter of the L2: 8 tasks at D = 64, at D = 128 4 or, on a 2 MiB L2, 8) still
// bounds it, and an L2 below 1 MiB to 4.
inline constexpr int kMaxQueryGroup = 8;

// The kernel lab's in-process A/B switch (dev/flash_lab --ab): 0 in every call but the lab's B
// calls, which set it to 1 between calls (never during one). A change under study reads it to run
// its variant beside the shipped code in one process, call by call, on a machine too busy for
// separate runs to compare; nothing reads it when no study is on.
inline int flash_lab_variant = 0;

// One problem of a flash call with its dropout (SdpaProblem::dropout()): the unit the ISA
// kernels (KernelSet::flash_forward) take, a batch of them at once (flash_schedule.hpp run_flash).
struct FlashJob {
    const SdpaProblem* p = nullptr;
    Dropout drop;
};

// The tile sizes the dispatch uses for these head dims and products (measured in
// dev/flash_lab.cpp; on AMX tiles in flash.cpp's comment).
FlashTiles flash_default_tiles(std::int64_t Dk, std::int64_t Dv, Compute compute = Compute::f32);

// Keys per chunk when a problem's tasks are split along the keys, or 0 for no split. A problem
// with fewer tasks than split_target(4) (few query blocks: B = 1 prefill of a few hundred
// queries on many cores) would leave cores idle; its tasks then run as (task, key chunk)
// items whose (m, l, Oᵀ) partials are merged per task in chunk order (flash_key_splits.hpp).
// Chunks are whole key blocks (multiples of Nb), at least kMinChunk = 256 keys
// and at most what keeps the partials (slot_floats each) within 256 MiB. forced_splits > 0
// (FlashTiles::key_splits) asks for that many chunks instead. Depends on the shape and the
// machine's CPU count, never the thread count, so results stay bit-identical across thread
// counts.
std::int64_t flash_key_chunk(std::int64_t tasks, std::int64_t Lk, int Nb, std::int64_t slot_floats,
                             int forced_splits);

// Tasks per work item for a problem whose tasks are not split: consecutive tasks of one
// (b, KV head) — query blocks of a head, or of the heads sharing the KV head — run as a group
// taking turns over the keys (flash_group_pass), so each K/V tile is read from memory once per
// group instead of once per task (flash_query_groups.hpp; measured in docs/kernels-lab.md, "Long keys").
// kv_heads: the problem's B·Hkv; kv_tasks: the tasks of each; head_kv_bytes: the K and V
// bytes one task streams (Lk keys); task_bytes: a task's Qᵀ and Oᵀ; converts: each task would
// convert (or copy) its K/V tiles — 16-bit K/V, a strided head dim, rows that lie apart — which
// a group does once for all its tasks (run_group; docs/kernels.md, "Groups of query blocks").
// Groups only where a head's K and V outgrow a core's L2 or the tiles are converted or copied,
// never to fewer than split_target(4) items.
// forced > 0 (FlashTiles::query_group) asks for that many instead. Groups change no result.
// l2_bytes: one core's L2 (0: this CPU's, CpuFeatures::l2_bytes). Groups of more than 4 only
// where it holds at least 1 MiB: 8 tasks at D = 64 keep 384 KiB of Qᵀ, Oᵀ and Sᵀ in it — most of
// Zen 3's 512 KiB, where groups of at most 4 were what was measured (kernels-lab fwd-6).
// quarter_l2: the group's Qᵀ + Oᵀ may fill a quarter of an L2 past 1 MiB instead of 256 KiB (the
// float32 operands; the operand hooks' groups, bf16 compute, measured level to 1 % slower with it:
// kernels-lab fwd-31).
int flash_query_group(std::int64_t kv_heads, std::int64_t kv_tasks, std::int64_t head_kv_bytes, std::int64_t task_bytes,
                      int forced, bool converts = false, std::int64_t l2_bytes = 0, bool quarter_l2 = true);

// Keys per pass of a group of query blocks (run_group): each task of the group runs a pass's key
// blocks one after another before the next task runs them, then the group moves to the next pass.
// The first task reads the pass's K and V rows from the L3 or memory, the others from the L2, and
// each task's Qᵀ, Sᵀ and Oᵀ stay near the core across the pass instead of being swapped out every
// key block (a pass of one block: the tasks in lockstep). A quarter of one core's L2 for the pass's K and
// V: 1024 keys at D = 64 on Sapphire Rapids' 2 MiB (S2 +1.5-2 % per CPU-second against one block,
// docs/kernels-lab.md fwd-18), 256 on Zen 3's 512 KiB; whole key blocks, at least one.
// key_bytes: K and V bytes of one key; l2_bytes: one core's L2 (0: this CPU's). forced > 0
// (FlashTiles::group_pass) asks for that many keys, rounded up to whole blocks. Changes no result:
// each task still runs its key blocks in order.
std::int64_t flash_group_pass(std::int64_t key_bytes, int Nb, int forced, std::int64_t l2_bytes = 0);

// Whether a problem's tasks request each next key block's K and V rows ahead (flash_operands.hpp,
// prefetch_kv_rows, KvAhead): when the rows come from the L3 or memory rather than the L2. The
// micro-kernels read a tile's rows interleaved, which the hardware prefetchers do not follow, and
// a wait on the L3 or memory then stalls the products. kv_tasks: tasks per (b, KV head);
// head_kv_bytes: the K and V bytes of a head (Lk keys); spread: the kernel asks for the lines a
// few per tile (KvAhead: the driver's kOpsSpreadRequests — the AVX-512 float32 and all-bf16 rows)
// rather than all at once. A head within one core's L2 (1 MiB, as flash_query_group) is read from there:
// no request. Past it, with spread requests, always: S2 and S3 (64 tasks per 2-4 MiB head, reread
// from the L3) +1-3 % per CPU-second on Sapphire Rapids, none measured slower past the runs' ±1 %
// (docs/kernels-lab.md, fwd-29). All at once (the other rows), only where a head is read by few
// tasks (at most 8) or passes 8 MiB: S4 +5 %, 32k keys +7-20 %, 64 rows of a KV head +5-25 %, but
// S2-like heads 0 to -5 % on Zen 5 (fwd-10), hence the L3 case there. (A task of one panel
// requests them in any case: the driver's ahead_end.)
bool flash_kv_ahead(std::int64_t kv_tasks, std::int64_t head_kv_bytes, bool spread = false);

// K and V bytes of a head that one core's L2 keeps (512 KiB on Zen 3, 1 MiB on Zen 4/5, 2 MiB on
// Sapphire Rapids): past it a head's tiles come from the L3 or memory (flash_query_group,
// flash_kv_ahead, flash_pack_one_panel).
inline constexpr std::int64_t kFlashCachedKvBytes = std::int64_t{1} << 20;

// Whether a task of one panel copies its float32 K/V tiles into the workspace (each row whole,
// in address order) instead of reading them in place: when the head's K and V pass the L2. The
// micro-kernels read a tile's rows interleaved, which the hardware prefetchers follow badly, and
// one panel gives each line too little work to hide the wait; the copy reads the rows as streams
// (as the widening of a 16-bit tile does). Measured (docs/kernels-lab.md, "Decode or flash"): one-panel
// float32 steps 0-15 % faster; multi-panel tasks reuse each line enough and read in place.
inline bool flash_pack_one_panel(std::int64_t head_kv_bytes) { return head_kv_bytes > kFlashCachedKvBytes; }

// Empty when the flash kernel supports the problem, else the reason it declines
// (e.g. "Q is float64: the flash kernel computes in float32").
std::string flash_decline_reason(const SdpaProblem& p);
// The same rule on the inputs' dtypes and head dims alone (all it looks at): for a caller that
// must refuse impl = flash before it has a problem (sdpa_varlen, whose batch may build none).
std::string flash_input_declines(DType q, DType k, DType v, std::int64_t Dk, std::int64_t Dv);

// Runs the kernel of the given kernel table row (tests pass each row; the dispatch passes
// kernel_set()). `threads` <= 0 means the OpenMP default (ATTN_NUM_THREADS, else
// OMP_NUM_THREADS, else all cores). Results do not depend on the thread count.
// Precondition: flash_decline_reason(p) is empty (the dispatch checks it).
void flash_forward(const SdpaProblem& p, const KernelSet& kernels, int threads = 0, const FlashTiles* tiles = nullptr);

// n problems (sdpa_varlen's sequences) in one parallel region over one task list, the
// problems with the most keys first (their tasks are the longest): one fork/join and one
// tail for the batch. Each problem's result is the one flash_forward gives it alone.
// Preconditions: flash_decline_reason is empty for each; throws attn::Error unless all have
// the same head dims (Dk, Dv) and the same choice of bf16 compute (flash_compute on `kernels`).
void flash_forward_batch(const SdpaProblem* ps, std::size_t n, const KernelSet& kernels, int threads = 0,
                         const FlashTiles* tiles = nullptr);

// How flash_forward on `row` computes p's products: on bf16 pairs (Compute::bf16_dot,
// KernelSet::flash_forward_bf16) when the row has them, Q, K, V and out are all bfloat16
// (SdpaProblem::bf16_products) and the CPU has AVX-512 BF16; else float32 (Compute::f32). In
// bf16 compute Pᵀ is rounded to bf16 before P·V (docs/conventions.md, "bf16 compute", states
// the error this adds). The one statement of the rule: the kernel's choice, the reports'
// kernel names (kernel_name) and the tests ask it.
Compute flash_compute(const KernelSet& row, const SdpaProblem& p);

}  // namespace attn::detail
