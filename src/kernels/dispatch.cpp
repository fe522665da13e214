#include "dispatch.hpp"

#include <string>
#include <utility>

#include "attn/error.hpp"
#include "../core/check.hpp"
#include "flash/flash.hpp"
#include "reference/reference.hpp"
#include "decode/decode.hpp"

namespace attn::detail {

std::string dtypes_of(const SdpaProblem& p) {
    return "Q " + std::string(dtype_name(p.q.dtype())) + ", K " + std::string(dtype_name(p.k.dtype())) + ", V " +
           std::string(dtype_name(p.v.dtype())) + ", out " + std::string(dtype_name(p.out.dtype()));
}

std::string head_dims_decline(std::int64_t Dk, std::int64_t Dv) {
    if (Dk <= kMaxFastHeadDim && Dv <= kMaxFastHeadDim) return {};
    return "head dims Dk = " + std::to_string(Dk) + ", Dv = " + std::to_string(Dv) + " exceed the fast kernels' " +
           std::to_string(kMaxFastHeadDim) + " (their per-thread tiles hold 64 rows of each)";
}

// Order: the decode kernel (decode/decode.cpp decode_chosen), then flash, then the reference.
// Impl::flash    → the flash kernel, or an error saying why it cannot run this call.
// Impl::automatic → flash when it supports the call, else the reference; the report
//                   says which ran and why the other was declined.
// Impl::reference → the textbook oracle (double accumulation).
bool runs_flash(const SdpaProblem& problem, Impl requested) {
    // run_forward's order: decode (automatic only, when it is auto's choice), then flash.
    if (requested != Impl::flash && requested != Impl::automatic) return false;
    if (requested == Impl::automatic && auto_decode_declines(problem, kernel_set()).empty()) return false;
    return flash_decline_reason(problem).empty();
}

void require_requested_kernel_runs(const SdpaProblem& problem, Impl requested) {
    if (requested == Impl::decode) {
        const std::string why_not = decode_declines(problem);
        if (!why_not.empty()) fail(problem.op, "impl: the decode kernel cannot run this call: ", why_not);
    }
    if (requested == Impl::flash) {
        const std::string decline = flash_decline_reason(problem);
        if (!decline.empty()) fail(problem.op, "impl: flash cannot run this call: ", decline, "; use auto or reference");
    }
}

ForwardChoice choose_forward(const SdpaProblem& problem, Impl requested, bool report) {
    require_requested_kernel_runs(problem, requested);
    ForwardChoice choice;
    SdpaReport* const text = report ? &choice.text : nullptr;
    std::string explanation;
    // The decode kernel first (impl = decode, or auto where auto_decode_declines is empty); then
    // flash, which reads float16/bfloat16 Q, K, V per tile and writes any output dtype.
    if (requested == Impl::decode || requested == Impl::automatic) {
        std::string why_isa;
        const KernelSet& kernels = kernel_set(&why_isa);
        if (decode_chosen(problem, requested, kernels, why_isa, explanation, text)) {
            choice.kernel = ForwardKernel::decode;
            choice.kernels = &kernels;
            return choice;
        }
    }
    bool use_flash = false;
    if (requested == Impl::flash) {
        use_flash = true;  // it can: require_requested_kernel_runs
    } else if (requested == Impl::automatic) {
        const std::string decline = flash_decline_reason(problem);
        use_flash = decline.empty();
        explanation += use_flash ? "auto: flash supports this call (" + dtypes_of(problem) + ")\n"
                                : "auto: flash declined: " + decline + " → reference\n";
    } else {
        explanation += "reference requested: flash not considered\n";
    }
    if (use_flash) {
        std::string why_isa;
        const KernelSet& kernels = kernel_set(&why_isa);
        choice.kernel = ForwardKernel::flash;
        choice.kernels = &kernels;
        if (text != nullptr) {
            // bf16 compute (isa.hpp) is part of the avx512 row; the label says when it ran.
            const Compute compute = flash_compute(kernels, problem);
            const bool bf16 = compute != Compute::f32;
            text->kernel = kernel_name("flash", kernels, compute);
            text->explanation = explanation + "ran: flash (fused tiled online softmax, " + isa_label(kernels, compute) + " path: " +
                                why_isa + "; " + dtypes_of(problem) + ", fp32 accumulation" +
                                (compute == Compute::bf16_amx ? "; bf16 compute: Q·Kᵀ and P·V as tdpbf16ps on AMX tiles, P rounded to bf16"
                                : bf16 ? "; bf16 compute: Q·Kᵀ and P·V as vdpbf16ps, P rounded to bf16" : "") + ")" +
                                (problem.weights ? "; weights from the saved lse in a second pass" : "") +
                                (problem.scores ? "; scores tile by tile in a second pass" : "");
        }
    } else if (text != nullptr) {
        text->kernel = "reference";
        text->explanation = explanation + "ran: reference (textbook, double accumulation)";
    }
    return choice;
}

void run_chosen(const SdpaProblem& problem, ForwardChoice& choice, SdpaReport* report) {
    switch (choice.kernel) {
        case ForwardKernel::decode: decode_forward(problem, *choice.kernels); break;
        case ForwardKernel::flash: flash_forward(problem, *choice.kernels); break;
        case ForwardKernel::reference: reference_forward(problem); break;
    }
    if (report != nullptr) *report = std::move(choice.text);  // a move: nothing can fail after the kernel
}

void run_forward(const SdpaProblem& problem, Impl requested, SdpaReport* report) {
    ForwardChoice choice = choose_forward(problem, requested, report != nullptr);
    run_chosen(problem, choice, report);
}

}  // namespace attn::detail
