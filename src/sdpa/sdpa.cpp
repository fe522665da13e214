// attn::sdpa: validate once, pick a kernel, run it.
#include "attn/sdpa.hpp"

#include "attn/error.hpp"
#include "../core/allocate.hpp"
#include "../kernels/dispatch.hpp"
#include "problem.hpp"
#include "../core/check.hpp"
#include "../core/threads.hpp"

namespace attn {

void sdpa(const TensorView& q, const TensorView& k, const TensorView& v, const SdpaOptions& options,
          const TensorView& out, const TensorView* lse, const TensorView* weights, SdpaReport* report,
          const ScoresOutput* scores) {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    detail::SdpaProblem problem;
    detail::ForwardChoice choice;
    // Up to the kernel, the call allocates only its checks' lists of tensors and the strings of
    // its choice and report: a refusal there is attn::OutOfMemory saying so (it was a bare
    // std::bad_alloc), and nothing is written yet. The kernels name their own buffers.
    detail::naming_bookkeeping("sdpa's argument checks and report text", [&] {
        problem = detail::make_problem(q, k, v, options, out, lse, weights);
        if (scores != nullptr) detail::attach_scores(problem, *scores);
        detail::require_outputs_apart(problem, options);
        choice = detail::choose_forward(problem, options.impl, report != nullptr);
    });
    detail::run_chosen(problem, choice, report);
}

namespace detail {
void check_call(const TensorView& q, const TensorView& k, const TensorView& v, const SdpaOptions& options,
                const TensorView& out, const TensorView* weights, std::string_view op, SizeZero zero) {
    const SdpaProblem p = make_problem(q, k, v, options, out, nullptr, weights, op, OutLse::written, zero);
    require_requested_kernel_runs(p, options.impl);
}
}  // namespace detail

SdpaShapes sdpa_output_shapes(const TensorView& q, const TensorView& k, const TensorView& v) {
    detail::SdpaProblem p;
    detail::check_qkv(q, k, v, p, "sdpa");
    return SdpaShapes{Shape{p.B, p.Hq, p.Lq, p.Dv}, Shape{p.B, p.Hq, p.Lq}, Shape{p.B, p.Hq, p.Lq, p.Lk}};
}

std::string_view impl_name(Impl impl) {
    switch (impl) {
        case Impl::automatic: return "auto";
        case Impl::reference: return "reference";
        case Impl::flash: return "flash";
        case Impl::decode: return "decode";
    }
    return "?";
}

Impl parse_impl(std::string_view name) {
    for (Impl i : {Impl::automatic, Impl::reference, Impl::flash, Impl::decode})
        if (name == impl_name(i)) return i;
    throw Error("impl: expected one of auto, reference, flash, decode but got " + detail::quoted(name));
}

std::string_view score_stage_name(ScoreStage s) {
    switch (s) {
        case ScoreStage::scaled: return "scaled";
        case ScoreStage::softcapped: return "softcapped";
        case ScoreStage::masked: return "masked";
    }
    return "?";
}

ScoreStage parse_score_stage(std::string_view name) {
    for (ScoreStage s : {ScoreStage::scaled, ScoreStage::softcapped, ScoreStage::masked})
        if (name == score_stage_name(s)) return s;
    throw Error("scores stage: expected one of scaled, softcapped, masked but got " + detail::quoted(name));
}

Causal parse_causal(std::string_view name) {
    if (name == "none") return Causal::none;
    if (name == "top-left") return Causal::top_left;
    if (name == "bottom-right") return Causal::bottom_right;
    throw Error("causal: expected top-left or bottom-right (or none) but got " + detail::quoted(name));
}

}  // namespace attn
