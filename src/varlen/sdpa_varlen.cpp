// attn::sdpa_varlen: a packed batch is N ordinary sdpa problems on strided views of the packed
// tensors (packed.hpp), run through the one dispatch (kernels/dispatch.cpp) — no copy, no
// padding. Every problem is built (and so checked) before the first is run.
#include "attn/sdpa_varlen.hpp"


#include <omp.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../core/check.hpp"
#include "../kernels/decode/decode.hpp"
#include "../kernels/dispatch.hpp"
#include "../kernels/flash/flash.hpp"
#include "../sdpa/problem.hpp"
#include "head_major.hpp"
#include "packed.hpp"
#include "run_sequences.hpp"

namespace attn {
namespace {

constexpr std::string_view kOp = "sdpa_varlen";

// The errors run_forward (kernels/dispatch.cpp) would throw for this problem, raised before
// any sequence is run: an explicit kernel that declines it. Built from the kernels' own
// decline reasons. (16-bit K/V need no check: flash reads them for any Lq.)
void require_runnable(const detail::SdpaProblem& p, Impl impl, std::int64_t b) {
    if (impl == Impl::flash) {
        const std::string why = detail::flash_decline_reason(p);
        if (!why.empty()) detail::fail(kOp, "impl: flash cannot run sequence ", b, ": ", why, "; use auto or reference");
        return;
    }
    if (impl == Impl::decode) {
        const std::string why = detail::decode_declines(p);
        if (!why.empty()) detail::fail(kOp, "impl: the decode kernel cannot run sequence ", b, ": ", why);
    }
}

}  // namespace

void sdpa_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens_q,
                 const TensorView& cu_seqlens_k, const SdpaOptions& options, const TensorView& out,
                 const TensorView* lse, SdpaReport* report) {
    // 16-bit q/k/v and out as in sdpa (make_problem per sequence; a 16-bit out is rounded once).
    const detail::PackedBatch pb =
        detail::check_packed(kOp, q, k, v, cu_seqlens_q, cu_seqlens_k, options, out, lse, /*sixteen_bit_out=*/true);
    if (!is_floating(q.dtype())) {
        detail::fail(kOp, "q: dtype must be float32, float64, float16 or bfloat16 but got ", dtype_name(q.dtype()));
    }

    // Build every sequence's problem first: nothing is written until all are valid.
    std::vector<detail::SdpaProblem> problems;
    std::vector<std::int64_t> keyless;  // Lq_b > 0 = Lk_b: rows that see no key
    for (std::size_t b = 0; b < pb.seqs.size(); ++b) {
        const detail::PackedSequence& s = pb.seqs[b];
        if (s.lq == 0) continue;
        if (s.lk == 0) {
            keyless.push_back(static_cast<std::int64_t>(b));
            continue;
        }
        const TensorView lse_b = lse ? detail::sequence_lse(*lse, s.q0, s.lq) : TensorView{};
        problems.push_back(detail::make_problem(
            detail::sequence_rows(q, s.q0, s.lq), detail::sequence_rows(k, s.k0, s.lk),
            detail::sequence_rows(v, s.k0, s.lk), detail::sequence_options(options, static_cast<std::int64_t>(b)),
            detail::sequence_rows(out, s.q0, s.lq), lse ? &lse_b : nullptr, nullptr, kOp));
        require_runnable(problems.back(), options.impl, static_cast<std::int64_t>(b));
    }

    for (std::int64_t b : keyless) {  // the fully-masked-row rule: out 0, lse −inf (σ_h with sinks)
        const detail::PackedSequence& s = pb.seqs[static_cast<std::size_t>(b)];
        const TensorView lse_rows = lse ? lse->slice(0, s.q0, s.lq) : TensorView{};
        detail::fill_keyless(options, out.slice(0, s.q0, s.lq), lse ? &lse_rows : nullptr);
    }

    std::vector<SdpaReport> reports(problems.size());
    detail::HeadMajorScratch scratch;  // one allocation, for the largest sequence that is copied
    for (const detail::SdpaProblem& p : problems)
        if (detail::head_major_pays(p)) scratch.reserve(p);
    detail::run_sequences(
        problems.size(), [&](std::size_t i) { return problems[i].Hq * ((problems[i].Lq + 63) / 64); },
        [&](std::size_t i) {
            SdpaReport* r = report ? &reports[i] : nullptr;
            // A long sequence runs alone with every thread (run_sequences.hpp): its K/V are
            // read head-major from one reused scratch (head_major.hpp: ~14 % faster on V1).
            if (options.impl != Impl::reference && !omp_in_parallel() && detail::head_major_pays(problems[i])) {
                detail::run_forward(detail::head_major_kv(problems[i], scratch), options.impl, r);
            } else {
                detail::run_forward(problems[i], options.impl, r);
            }
        });

    if (report != nullptr) {
        std::map<std::string, int> count;
        for (const SdpaReport& r : reports) ++count[r.kernel];
        report->kernel.clear();
        for (const auto& [name, n] : count) {
            report->kernel += (report->kernel.empty() ? "" : ", ") + name + " x" + std::to_string(n);
        }
        report->explanation = std::to_string(pb.seqs.size()) + " packed sequences, " + std::to_string(problems.size()) +
                              " with queries and keys, " + std::to_string(keyless.size()) + " without keys\n" +
                              (reports.empty() ? std::string() : "first sequence:\n" + reports.front().explanation + "\n") +
                              "ran: " + (report->kernel.empty() ? std::string("nothing") : report->kernel);
    }
}

}  // namespace attn
