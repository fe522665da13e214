#include "dispatch.hpp"

#include "attn/error.hpp"
#include "reference/reference.hpp"
#include "decode/decode.hpp"

namespace attn::detail {

void run_forward(const SdpaProblem& problem, Impl requested, SdpaReport* report) {
    std::string explanation;
    // Decode branch (issue 6): Lq <= 16, and every float16/bfloat16 K/V, are decided first.
    if (dispatch_decode(problem, requested, report, explanation)) return;
    if (requested == Impl::flash) {
        throw Error("impl: the flash kernel is not built into this version of attn; use auto or reference");
    }
    if (requested == Impl::automatic) explanation += "auto: reference (the only kernel in this build)\n";
    reference_forward(problem);
    if (report != nullptr) {
        report->kernel = "reference";
        report->explanation = explanation + "ran: reference (textbook, double accumulation)";
    }
}

}  // namespace attn::detail
