// Decode kernel: planning, scratch and the sdpa dispatch branch.
#include "decode.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "attn/decode.hpp"
#include "../dispatch.hpp"
#include "../isa.hpp"
#include "../../core/allocate.hpp"
#include "../../core/check.hpp"
#include "../../core/threads.hpp"
#include "../../sdpa/problem.hpp"
#include "decode_core.hpp"

namespace attn::detail {

DecodePlan plan_decode(std::int64_t B, std::int64_t Hkv, std::int64_t group, std::int64_t Lq, std::int64_t Lk,
                       std::int64_t Dk, std::int64_t Dv, std::int64_t forced_split) {
    DecodePlan plan;
    const std::int64_t M = group * Lq;
    // Enough items for every core to get four (split_target: dynamic scheduling evens out
    // sequences of different lengths; S7's 8 KV heads on 2 cores need no split and no merge),
    // but chunks of at least kMinChunk keys so the partials and the merge stay small next to
    // the K/V bytes they summarise.
    constexpr std::int64_t kMinChunk = 256;
    const std::int64_t target = split_target(4);
    std::int64_t nsplit = 1;
    if (forced_split > 0) {
        nsplit = forced_split;
    } else if (B * Hkv < target) {
        nsplit = std::min((target + B * Hkv - 1) / (B * Hkv), (Lk + kMinChunk - 1) / kMinChunk);
    }
    nsplit = std::max<std::int64_t>(1, std::min(nsplit, Lk));
    // Chunks start on block boundaries; recompute the count so no chunk is empty.
    std::int64_t chunk = (Lk + nsplit - 1) / nsplit;
    if (nsplit > 1 && chunk > kDecodeBlock) chunk = (chunk + kDecodeBlock - 1) / kDecodeBlock * kDecodeBlock;
    nsplit = (Lk + chunk - 1) / chunk;
    plan.nsplit = nsplit;
    plan.chunk = chunk;
    plan.work_per_thread = (scratch_floats(M, Dk, Dv) + 15) / 16 * 16;  // 64-byte multiples
    plan.partial_floats = nsplit > 1 ? B * Hkv * nsplit * (M * Dv + 2 * M) : 0;
    return plan;
}

std::string decode_call_declines(const TensorView& q, const TensorView& k, const TensorView& v, double dropout_p,
                                 bool weights, bool scores) {
    auto is_store = [](DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; };
    if (weights) return "attention weights were requested (decode never forms them)";
    if (scores) return "scores were requested (decode never forms them)";
    if (dropout_p > 0.0) return "dropout was requested (decode applies none)";
    // Q: float32 or 16-bit (converted while it is scaled); out: any output dtype (store_row).
    if (q.dtype() == DType::f64) return "Q is float64, decode reads float32, float16 or bfloat16";
    if (!is_store(k.dtype()) || k.dtype() != v.dtype())
        return "K is " + std::string(dtype_name(k.dtype())) + " and V is " + std::string(dtype_name(v.dtype())) +
               ", decode needs both float32, both float16 or both bfloat16";
    // An empty K or V is never read: its head-dim stride means nothing (NumPy gives a size-0
    // array strides of 0 — attn.torch's empty calls, checked by _check_sdpa, were refused).
    const auto strided = [](const TensorView& t) { return t.stride(t.rank() - 1) != 1 && !is_empty(t); };
    if (strided(k) || strided(v)) return "K or V is strided along the head dim (decode needs unit stride)";
    return head_dims_decline(q.dim(q.rank() - 1), v.dim(v.rank() - 1));
}

std::string decode_rows_declines(std::int64_t Lq) {
    if (Lq > kMaxDecodeQueries) return "Lq = " + std::to_string(Lq) + " > 16 (decode is for a few new queries)";
    return {};
}

std::string decode_declines(const SdpaProblem& p) {
    if (std::string why = decode_rows_declines(p.Lq); !why.empty()) return why;
    return decode_call_declines(p.q, p.k, p.v, p.dropout_p, p.weights.has_value(), p.scores.has_value());
}

int auto_decode_panels(const SdpaProblem& p) {
    return p.k.dtype() == DType::f32 && p.v.dtype() == DType::f32 ? 2 : 1;
}

namespace {
// "64, two flash panels of 32 on the avx512 row (float32 K/V)": the limit auto_decode_declines
// applies, in the words both of its reports use.
std::string decode_row_limit(const SdpaProblem& p, const KernelSet& k) {
    const int panels = auto_decode_panels(p);
    return std::to_string(panels * k.flash_panel) + ", " + (panels == 2 ? "two flash panels" : "one flash panel") +
           " of " + std::to_string(k.flash_panel) + " on the " + isa_name(k.isa) + " row (" +
           (panels == 2 ? "float32 K/V" : "16-bit K or V") + ")";
}
}  // namespace

std::string auto_decode_declines(const SdpaProblem& p, const KernelSet& k) {
    std::string why = decode_declines(p);
    if (!why.empty()) return why;
    const std::int64_t rows = p.group * p.Lq;
    if (rows >= auto_decode_panels(p) * k.flash_panel)
        return "group·Lq = " + std::to_string(rows) + " rows per KV head reach " + decode_row_limit(p, k) +
               ": flash computes them faster";
    return {};
}

void decode_forward(const SdpaProblem& p, const KernelSet& kernels, std::int64_t forced_split, const PagedRows* paged) {
    const DecodePlan plan = plan_decode(p.B, p.Hkv, p.group, p.Lq, p.Lk, p.Dk, p.Dv, forced_split);
    // The key interval of every (b, i), from the one alignment rule.
    std::vector<std::int64_t> range;
    resize_or_throw(range, 2 * p.B * p.Lq, "the decode kernel's key interval of every query row");
    for (std::int64_t b = 0; b < p.B; ++b)
        for (std::int64_t i = 0; i < p.Lq; ++i) {
            const KeyRange r = p.key_range(b, i);
            range[static_cast<std::size_t>(2 * (b * p.Lq + i))] = r.lo;
            range[static_cast<std::size_t>(2 * (b * p.Lq + i) + 1)] = std::max(r.lo, r.hi);
        }
    DecodeWork w;
    w.nsplit = plan.nsplit;
    w.chunk = plan.chunk;
    w.range = range.data();
    w.paged = paged;
    w.max_threads = std::max(1, omp_get_max_threads());
    w.work_per_thread = plan.work_per_thread;
    // One allocation for the per-thread scratch and the split partials (small: about
    // M·(Dk+Dv+64) floats per thread and B·Hkv·nsplit·M·(Dv+2) floats).
    const std::size_t floats =
        static_cast<std::size_t>(plan.work_per_thread * w.max_threads + plan.partial_floats) + 16;
    std::unique_ptr<float[]> buffer;
    try {
        buffer.reset(new float[floats]);
    } catch (const std::bad_alloc&) {
        throw_out_of_memory(static_cast<std::int64_t>(floats * sizeof(float)),
                            "the decode kernel's scratch (one per thread) and split partials");
    }
    float* base = buffer.get();
    base += (16 - (reinterpret_cast<std::uintptr_t>(base) / sizeof(float)) % 16) % 16;  // 64-byte align
    w.work = base;
    w.partial = plan.partial_floats > 0 ? base + plan.work_per_thread * w.max_threads : nullptr;
    const Interrupt interrupt;
    w.interrupt = &interrupt;
    kernels.decode(p, w);
    interrupt.throw_if_requested();
}

}  // namespace attn::detail

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "../dispatch.hpp"

namespace attn::detail {

bool decode_chosen(const SdpaProblem& p, Impl requested, const KernelSet& kernels, const std::string& why_isa,
                   std::string& explanation, SdpaReport* text) {
    // The reference reads every dtype; flash reads float32/float16/bfloat16 Q, K, V itself.
    if (requested == Impl::reference || requested == Impl::flash) return false;
    // impl = decode was checked by choose_forward (require_requested_kernel_runs): it runs.
    const std::string why_not = requested == Impl::decode ? std::string() : auto_decode_declines(p, kernels);
    if (!why_not.empty()) {
        explanation += "decode: declined, " + why_not + "\n";
        return false;
    }
    if (text != nullptr) {
        text->kernel = kernel_name("decode", kernels);
        text->explanation = explanation +
                            (requested == Impl::automatic
                                 ? "auto: decode (group·Lq = " + std::to_string(p.group * p.Lq) + " rows per KV head < " +
                                       decode_row_limit(p, kernels) + ")\n"
                                 : "") +
                            "ran: decode (" + isa_name(kernels.isa) + " path: " + why_isa + "; " + dtypes_of(p) +
                            ", fp32 accumulation)";
    }
    return true;
}

}  // namespace attn::detail
