// attn::sdpa_backward: validate once (the forward's checks plus the extra tensors),
// pick a backward kernel, run it.
#include "attn/sdpa_backward.hpp"

#include <cstdint>
#include <string>
#include <utility>

#include "attn/error.hpp"
#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../kernels/backward/backward.hpp"
#include "problem.hpp"
#include "../core/threads.hpp"

namespace attn {
namespace {

constexpr std::string_view kOp = "sdpa_backward";

}  // namespace

void sdpa_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse, const TensorView& grad_out, const SdpaOptions& options,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv, SdpaReport* report,
                   const TensorView* dsinks) {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    detail::BackwardProblem p;
    std::string ran, explanation;
    const detail::KernelSet* kernels = nullptr;
    // Up to the kernel, the call allocates only its checks' lists of tensors and the report's text:
    // a refusal there is attn::OutOfMemory saying so (it was a bare std::bad_alloc), and nothing is
    // written yet. The kernels name their own buffers.
    detail::naming_bookkeeping("sdpa_backward's argument checks and report text", [&] {
        p.fwd = detail::make_problem(q, k, v, options, out, &lse, nullptr, kOp, detail::OutLse::read);
        // make_problem admits q, k, v, out in float32, float64, float16 or bfloat16; lse stays
        // float32/float64 (its check).
        detail::require_backward_gradients(kOp, q, k, v, out, lse, grad_out, options, dq, dk, dv, dsinks, p.fwd.Hq);
        if (dsinks != nullptr) p.dsinks = *dsinks;
        p.grad_out = grad_out;
        p.dq = dq;
        p.dk = dk;
        p.dv = dv;

        // The fast kernel computes in float32: it widens float32, float16 and bfloat16 inputs per
        // tile; float64 inputs (and a float64 lse) are the reference's, as in the forward. The
        // gradients may have any floating dtype: each is rounded once from the float32 sums.
        const std::string declines = detail::flash_backward_declines(q, k, v, out, lse, grad_out);
        std::string why;
        bool use_flash = false;
        switch (options.impl) {
            case Impl::reference: why = "reference: requested\n"; break;
            case Impl::flash:
                if (!declines.empty()) detail::fail(kOp, "impl: the flash backward cannot run this call: ", declines, "; use auto or reference");
                use_flash = true;
                break;
            case Impl::decode: detail::fail(kOp, "impl: decode is a forward-only kernel; use auto, reference or flash");
            case Impl::automatic:
                use_flash = declines.empty();
                if (!use_flash) why = "flash: declined, " + declines + " → reference\n";
                break;
        }
        // The report's text is made before the kernel runs: a refusal of its few bytes after the
        // kernel had written dq, dk and dv threw std::bad_alloc from a call whose gradients were
        // all written (test_alloc_failures' several-chunk sweep). After the kernel, only moves.
        if (use_flash) {
            std::string why_isa;
            kernels = &detail::kernel_set(&why_isa);
            ran = detail::kernel_name("flash-backward", *kernels, detail::backward_compute(*kernels, p));
            why += std::string("isa: ") + why_isa + "\n";
        } else {
            ran = "reference-backward";
        }
        if (report != nullptr) explanation = why + "ran: " + ran;
    });
    if (kernels != nullptr) detail::flash_backward(p, *kernels);
    else detail::reference_backward(p);
    if (report != nullptr) {
        report->kernel = std::move(ran);
        report->explanation = std::move(explanation);
    }
}

}  // namespace attn
