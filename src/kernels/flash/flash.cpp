// Flash kernel front: what it supports, its tile sizes, and the ISA switch.
#include "flash.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "attn/error.hpp"
#include "attn/threads.hpp"
#include "../../core/allocate.hpp"
#include "../../core/cpu_features.hpp"
#include "../../core/threads.hpp"
#include "../dispatch.hpp"

namespace attn::detail {

// 64 queries × 64 keys for every head dim: Qᵀ, Sᵀ and Oᵀ of a task are 16 KiB each at D = 64
// (L1/L2), and the lab's sweep (dev/flash_lab.cpp header; docs/kernels-lab.md, "The tile and block
// sizes") found the other sizes equal within the noise or slower (Nb = 32 with Mb = 32: −35 % at
// D = 64), at D = 128 and D = 64 alike; D = 256 measured at the same efficiency with 64 × 64.
// On AMX tiles (Compute::bf16_amx) 128 queries × 256 keys: each task transposed V's key blocks for
// itself (a thread's tasks share a head's since kernels-lab fwd-16; the sizes were not measured
// again) and each tile product block starts and drains the tile pipeline, so fewer, larger tasks
// and blocks pay off there — 128 × 128 was S2 (D = 64) −16 %, S3 (D = 128) −10 % CPU time per call
// against 64 × 64 on the Sapphire Rapids VM; once the softmax lost its column-max pass over Sᵀ,
// 256 keys (an Oᵀ tile block runs 8 steps, not 4) gained 3–4 % (S2) and 2–3 % (S3) on 128 × 128;
// 128 × 512 +1–2 % on S2 but −8 % on S3 (causal: more masked keys per block); 256 × 128 −6 %
// and −10 %, 64 × 256 −12 % (docs/kernels-lab.md, "The AMX forward's softmax and blocks").
FlashTiles flash_default_tiles(std::int64_t Dk, std::int64_t Dv, Compute compute) {
    (void)Dk;
    (void)Dv;
    if (compute == Compute::bf16_amx) return FlashTiles{128, 256};
    return FlashTiles{64, 64};
}

std::int64_t flash_key_chunk(std::int64_t tasks, std::int64_t Lk, int Nb, std::int64_t slot_floats,
                             int forced_splits) {
    constexpr std::int64_t kMinChunk = 256;                 // 4 key blocks: the Qᵀ pack and merge stay small
    constexpr std::int64_t kMaxPartialFloats = 64LL << 20;  // 256 MiB of partials
    if (tasks <= 0 || Lk <= Nb) return 0;
    std::int64_t splits = 1;
    if (forced_splits > 0) {
        splits = forced_splits;
    } else {
        const std::int64_t target = split_target(4);
        if (tasks >= target) return 0;
        splits = std::min((target + tasks - 1) / tasks, Lk / kMinChunk);
        splits = std::min(splits, std::max<std::int64_t>(1, kMaxPartialFloats / (tasks * std::max<std::int64_t>(1, slot_floats))));
    }
    if (splits <= 1) return 0;
    const std::int64_t blocks = (Lk + Nb - 1) / Nb;
    const std::int64_t chunk = (blocks + splits - 1) / splits * Nb;  // whole key blocks
    return chunk < Lk ? chunk : 0;
}

int flash_query_group(std::int64_t kv_heads, std::int64_t kv_tasks, std::int64_t head_kv_bytes, std::int64_t task_bytes,
                      int forced, bool converts, std::int64_t l2_bytes, bool quarter_l2) {
    const std::int64_t tasks = std::max<std::int64_t>(1, kv_tasks);
    if (forced > 0) return static_cast<int>(std::min<std::int64_t>({forced, kMaxQueryGroup, tasks}));
    const std::int64_t l2 = l2_bytes > 0 ? l2_bytes : cpu_features().l2_bytes;
    const std::int64_t most = std::min<std::int64_t>(l2 >= (std::int64_t{1} << 20) ? kMaxQueryGroup : 4, tasks);
    // A head's K and V within one core's L2 (512 KiB on Zen 3, 1 MiB on Zen 4/5) are read from
    // there by every task: nothing to gain — unless each task converts its tiles (16-bit K/V) or
    // would read rows that lie apart (rows_apart), which a group converts or copies once for its
    // tasks. The group's Qᵀ and Oᵀ must stay in the L2 beside the pass's K and V (a quarter of it,
    // flash_group_pass): at most 256 KiB of them (8 tasks at D = 64, 4 at 128, 2 at 256), or with
    // quarter_l2 a quarter of an L2 past 1 MiB — Sapphire Rapids' 2 MiB: 512 KiB, 8 tasks at D = 128
    // (S3 +0.7-1.1 % per CPU-second against 4, each head's K/V read from the L3 half as often;
    // kernels-lab fwd-31).
    const std::int64_t group_bytes = std::max<std::int64_t>(std::int64_t{256} << 10, quarter_l2 ? l2 / 4 : 0);
    if (head_kv_bytes <= kFlashCachedKvBytes && !converts) return 1;
    const std::int64_t target = split_target(4);
    for (std::int64_t g = std::min(most, group_bytes / std::max<std::int64_t>(1, task_bytes)); g > 1; --g)
        if (kv_heads * ((kv_tasks + g - 1) / g) >= target) return static_cast<int>(g);
    return 1;
}

std::int64_t flash_group_pass(std::int64_t key_bytes, int Nb, int forced, std::int64_t l2_bytes) {
    const std::int64_t nb = std::max(1, Nb);
    if (forced > 0) return (forced + nb - 1) / nb * nb;
    const std::int64_t l2 = l2_bytes > 0 ? l2_bytes : cpu_features().l2_bytes;
    const std::int64_t keys = l2 / 4 / std::max<std::int64_t>(1, key_bytes);
    return std::max<std::int64_t>(1, keys / nb) * nb;
}

bool flash_kv_ahead(std::int64_t kv_tasks, std::int64_t head_kv_bytes, bool spread) {
    constexpr std::int64_t kRereadKv = std::int64_t{8} << 20;
    constexpr std::int64_t kManyTasks = 8;
    if (head_kv_bytes <= kFlashCachedKvBytes) return false;
    return spread || kv_tasks <= kManyTasks || head_kv_bytes > kRereadKv;
}

std::string flash_decline_reason(const SdpaProblem& p) {
    return flash_input_declines(p.q.dtype(), p.k.dtype(), p.v.dtype(), p.Dk, p.Dv);
}

std::string flash_input_declines(DType q, DType k, DType v, std::int64_t Dk, std::int64_t Dv) {
    // float32, float16 and bfloat16 inputs are read as float32 (16-bit converted per tile,
    // flash_driver.hpp); out may be any of make_problem's output dtypes (store_row.hpp).
    // float64 inputs are the reference's: fp32 accumulation would throw their precision away.
    for (const auto& [t, name] : {std::pair{q, "Q"}, std::pair{k, "K"}, std::pair{v, "V"}}) {
        if (t == DType::f64)
            return std::string(name) + " is float64: the flash kernel reads float32, float16 or bfloat16 Q, K, V";
    }
    return head_dims_decline(Dk, Dv);
}

void flash_forward(const SdpaProblem& p, const KernelSet& kernels, int threads, const FlashTiles* tiles) {
    flash_forward_batch(&p, 1, kernels, threads, tiles);
}

void flash_forward_batch(const SdpaProblem* ps, std::size_t n, const KernelSet& kernels, int threads,
                         const FlashTiles* tiles) {
    if (n == 0) return;
    // bf16 compute (isa.hpp: a member of the avx512 row, not a row): Q, K, V all bfloat16 on
    // a CPU with AVX-512 BF16 (on AMX tiles where it has AMX-BF16). Any other mix runs the
    // row's float32 path.
    const Compute compute = flash_compute(kernels, ps[0]);
    const FlashTiles t = tiles != nullptr ? *tiles : flash_default_tiles(ps[0].Dk, ps[0].Dv, compute);
    // Only the lab and tests pass tiles; the driver needs whole 16-query panels.
    if (t.Mb < 16 || t.Mb % 16 != 0 || t.Mb > 4096 || t.Nb < 1 || t.Nb > 4096) {
        throw Error("flash tiles: Mb must be a multiple of 16 in [16, 4096] and Nb in [1, 4096] but got Mb=" +
                    std::to_string(t.Mb) + " Nb=" + std::to_string(t.Nb));
    }
    // The dispatch declines such head dims (head_dims_decline); a direct caller (tests, the lab)
    // must not reach the workspace sizing with them either.
    if (const std::string why = head_dims_decline(ps[0].Dk, ps[0].Dv); !why.empty()) throw Error("flash: " + why);
    if (t.query_group < 0 || t.query_group > kMaxQueryGroup) {
        throw Error("flash tiles: query_group must be in [0, " + std::to_string(kMaxQueryGroup) +
                    "] (0: the policy decides) but got " + std::to_string(t.query_group));
    }
    if (t.group_pass < 0)
        throw Error("flash tiles: group_pass must be >= 0 (0: the policy decides) but got " + std::to_string(t.group_pass));
    if (threads <= 0) threads = num_threads();  // the one thread setting (attn/threads.hpp)
    std::vector<FlashJob> jobs;
    resize_or_throw(jobs, static_cast<std::int64_t>(n), "the flash kernel's list of problems");
    for (std::size_t i = 0; i < n; ++i) {
        // One workspace per thread serves every problem: the same head dims and operand path.
        if (ps[i].Dk != ps[0].Dk || ps[i].Dv != ps[0].Dv || flash_compute(kernels, ps[i]) != compute)
            throw Error("flash batch: problem " + std::to_string(i) + " differs from problem 0 in its head dims or bf16 compute");
        jobs[i] = FlashJob{&ps[i], ps[i].dropout()};  // once per call; inactive when p = 0
    }
    // Longest tasks first (a task walks up to Lk keys), so the one dynamic schedule ends on
    // the short problems' tasks; stable: equal problems keep the caller's order.
    std::stable_sort(jobs.begin(), jobs.end(), [](const FlashJob& a, const FlashJob& b) { return a.p->Lk > b.p->Lk; });
    const auto count = static_cast<std::int64_t>(n);
    if (compute == Compute::bf16_amx) kernels.flash_forward_amx(jobs.data(), count, t, threads);
    else if (compute == Compute::bf16_dot) kernels.flash_forward_bf16(jobs.data(), count, t, threads);
    else kernels.flash_forward(jobs.data(), count, t, threads);
}

Compute flash_compute(const KernelSet& row, const SdpaProblem& p) {
    const bool bf16 = row.flash_forward_bf16 != nullptr && p.bf16_products && p.q.dtype() == DType::bf16 &&
                      p.k.dtype() == DType::bf16 && p.v.dtype() == DType::bf16 && cpu_features().has_avx512_bf16();
    if (!bf16) return Compute::f32;
    // The same products on AMX tiles where the CPU (and the OS) has them.
    return row.flash_forward_amx != nullptr && cpu_features().has_amx_bf16() ? Compute::bf16_amx : Compute::bf16_dot;
}

}  // namespace attn::detail
