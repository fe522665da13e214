// attn::sdpa_varlen_backward: sdpa_backward per sequence, on strided views of the packed
// tensors. Every check of sdpa_backward is made on the packed tensors (and every sequence's
// problem built) before the first gradient is written; the sequences write staged gradients,
// copied into dq, dk and dv once every sequence has run (staging.hpp): all or nothing.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "../core/threads.hpp"
#include "../kernels/backward/backward.hpp"
#include "../core/element_io.hpp"
#include "../sdpa/problem.hpp"
#include "head_major.hpp"
#include "packed.hpp"
#include "staging.hpp"

namespace attn {
namespace {

constexpr std::string_view kOp = "sdpa_varlen_backward";
// Besides the sequences' backwards, a call allocates only bookkeeping — its checks' lists of
// tensors, the sequences' table, which sequences run on head-major copies, the staged views, the
// report's text —: a refusal there is attn::OutOfMemory saying so (it was a bare std::bad_alloc),
// and no gradient is written yet. The scratch and each sequence's sdpa_backward name their own.
constexpr const char* kBookkeeping = "sdpa_varlen_backward's argument checks and report text";

}  // namespace

void sdpa_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const TensorView& out,
                          const TensorView& lse, const TensorView& grad_out, const SdpaOptions& options,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv, SdpaReport* report,
                          const TensorView* dsinks) {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    detail::PackedBatch pb;
    const auto check_call = [&] {
        pb = detail::check_packed(kOp, q, k, v, cu_seqlens_q, cu_seqlens_k, options, out, &lse,
                                  /*sixteen_bit_out=*/true, detail::OutLse::read);
        detail::require_floating(kOp, q, "q");
        detail::require_floating(kOp, k, "k");
        detail::require_floating(kOp, v, "v");
        detail::require_backward_gradients(kOp, q, k, v, out, lse, grad_out, options, dq, dk, dv, dsinks, pb.Hq);
        if (options.impl == Impl::decode) {
            detail::fail(kOp, "impl: decode is a forward-only kernel; use auto, reference or flash");
        }
        // The flash backward's inputs (sdpa_backward's rule), checked here before any sequence runs.
        const std::string declines = detail::flash_backward_declines(q, k, v, out, lse, grad_out);
        if (options.impl == Impl::flash && !declines.empty())
            detail::fail(kOp, "impl: the flash backward cannot run this call: ", declines, "; use auto or reference");
    };
    // Sequence b's views: the inputs Q, dO, K, V and the outputs dQ, dK, dV (sdpa_backward's).
    struct Views {
        TensorView in[4], out[3];
    };
    const auto views_of = [&](const detail::PackedSequence& s) {
        const auto rows_q = [&](const TensorView& t) { return detail::sequence_rows(t, s.q0, s.lq); };
        const auto rows_k = [&](const TensorView& t) { return detail::sequence_rows(t, s.k0, s.lk); };
        return Views{{rows_q(q), rows_q(grad_out), rows_k(k), rows_k(v)}, {rows_q(dq), rows_k(dk), rows_k(dv)}};
    };
    // Floats of the head-major copies of a sequence's strided input rows (detail::strided_rows);
    // nullopt when their bytes cannot be counted in 64 bits (broadcast K/V: far more elements than
    // memory) — no copy then. Its outputs are staged views, contiguous already.
    const auto copy_floats = [&](const Views& w) -> std::optional<std::int64_t> {
        std::optional<std::int64_t> n = 0;
        for (const TensorView& t : w.in)
            if (n && detail::strided_rows(t)) n = detail::size_add(*n, t.numel());
        return n && detail::size_mul(*n, std::int64_t{sizeof(float)}) ? n : std::nullopt;
    };
    // Every sequence's problem, checked before anything is written; the long sequences whose
    // backward reads head-major copies (head_major.hpp, head_major_backward_pays) while their
    // copies fit the budget, with the floats of the largest (one region of the scratch serves them
    // one after another); and every sequence's staged dQ, dK, dV, after that region.
    std::vector<char> head_major;
    std::int64_t scratch_floats = 0;
    detail::StagedOutputs staged;    // dQ, dK, dV of each sequence with queries and keys, in order
    std::vector<double> dsinks_sum;  // dsinks: each sequence's, summed in sequence order
    std::string first_line;          // the report's
    std::unique_ptr<detail::HeadMajorScratch> scratch;
    Tensor dsinks_b;  // dsinks: each sequence's, in float64
    detail::naming_bookkeeping(kBookkeeping, [&] {
        check_call();
        head_major.assign(pb.seqs.size(), 0);
        for (std::size_t b = 0; b < pb.seqs.size(); ++b) {
            const detail::PackedSequence& s = pb.seqs[b];
            if (s.lq == 0 || s.lk == 0) continue;
            const TensorView lse_b = detail::sequence_lse(lse, s.q0, s.lq);
            const detail::SdpaProblem p =
                detail::make_problem(detail::sequence_rows(q, s.q0, s.lq), detail::sequence_rows(k, s.k0, s.lk),
                                     detail::sequence_rows(v, s.k0, s.lk),
                                     detail::sequence_options(options, static_cast<std::int64_t>(b)),
                                     detail::sequence_rows(out, s.q0, s.lq), &lse_b, nullptr, kOp,
                                     detail::OutLse::read);
            const Views w = views_of(s);
            const std::optional<std::int64_t> n = copy_floats(w);
            if (options.impl != Impl::reference && detail::head_major_backward_pays(p) && n && *n > 0 &&
                *n * std::int64_t{sizeof(float)} <= detail::head_major_budget()) {
                head_major[b] = 1;
                scratch_floats = std::max(scratch_floats, *n);
            }
            for (const TensorView& t : w.out) staged.add(t);
        }
        dsinks_sum.assign(static_cast<std::size_t>(pb.Hq), 0.0);
        dsinks_b = Tensor(DType::f64, Shape{dsinks ? pb.Hq : 1});
        // One buffer, kept for the next call (head_major.hpp): a fresh one per call paid its page
        // faults; and those of threads faulting on one address space cost more than the copies.
        const std::int64_t copies_bytes = (scratch_floats * std::int64_t{sizeof(float)} + 63) / 64 * 64;
        if (copies_bytes + staged.bytes() > 0) {
            scratch = std::make_unique<detail::HeadMajorScratch>(
                copies_bytes + staged.bytes(), "sdpa_varlen_backward's staged dQ, dK, dV and head-major copies");
            staged.place(reinterpret_cast<char*>(scratch->data()) + copies_bytes);
        }
        if (report != nullptr)
            first_line = std::to_string(pb.seqs.size()) + " packed sequences, each through sdpa_backward\n";
    });

    // Sequences run one after another: each backward spreads its (head, key block) tasks
    // over all threads; the long ones on head-major copies (scratch above), each into its staged
    // dQ, dK, dV.
    SdpaReport last;
    const TensorView dsinks_bv = dsinks_b.view();
    std::size_t next_staged = 0;
    for (std::size_t b = 0; b < pb.seqs.size(); ++b) {
        const detail::PackedSequence& s = pb.seqs[b];
        if (s.lq == 0 || s.lk == 0) continue;  // zero gradients, written with the staged ones
        Views w = views_of(s);
        if (head_major[b]) {  // the same values head-major, so the same bits
            float* at = scratch->data();
            for (TensorView& t : w.in)
                if (detail::strided_rows(t)) t = detail::copy_head_major(t, at), at += t.numel();
        }
        for (TensorView& t : w.out) t = staged.staged(next_staged++);
        sdpa_backward(w.in[0], w.in[2], w.in[3], detail::sequence_rows(out, s.q0, s.lq),
                      detail::sequence_lse(lse, s.q0, s.lq), w.in[1],
                      detail::sequence_options(options, static_cast<std::int64_t>(b)), w.out[0], w.out[1], w.out[2],
                      report ? &last : nullptr, dsinks ? &dsinks_bv : nullptr);
        if (dsinks)
            for (std::int64_t h = 0; h < pb.Hq; ++h) dsinks_sum[static_cast<std::size_t>(h)] += dsinks_b.data_as<double>()[h];
    }
    // The last sequence's report is known only once it has run: its text joins the first line
    // before any gradient is written. From here on nothing allocates.
    if (report != nullptr) detail::naming_bookkeeping(kBookkeeping, [&] { first_line += last.explanation; });
    staged.commit();
    for (const detail::PackedSequence& s : pb.seqs) {
        if (s.lk == 0) detail::fill(dq.slice(0, s.q0, s.lq), 0.0);  // no key: its queries get no gradient
        if (s.lq == 0) {                                            // no query reads these keys
            detail::fill(dk.slice(0, s.k0, s.lk), 0.0);
            detail::fill(dv.slice(0, s.k0, s.lk), 0.0);
        }
    }
    if (dsinks)
        for (std::int64_t h = 0; h < pb.Hq; ++h)
            detail::store(*dsinks, dsinks->offset(h), dsinks_sum[static_cast<std::size_t>(h)]);
    if (report != nullptr) {
        report->kernel = std::move(last.kernel);
        report->explanation = std::move(first_line);
    }
}

}  // namespace attn
