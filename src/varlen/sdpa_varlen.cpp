// attn::sdpa_varlen: a packed batch is N ordinary sdpa problems on strided views of the packed
// tensors (packed.hpp), run through the one dispatch (kernels/dispatch.cpp) — no copy, no
// padding. Every problem is built (and so checked) before the first is run.
#include "attn/sdpa_varlen.hpp"


#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/threads.hpp"
#include "../kernels/decode/decode.hpp"
#include "../kernels/dispatch.hpp"
#include "../kernels/flash/flash.hpp"
#include "../kernels/isa.hpp"
#include "../sdpa/problem.hpp"
#include "head_major.hpp"
#include "packed.hpp"
#include "run_sequences.hpp"
#include "staging.hpp"
#include "varlen_call.hpp"

namespace attn {
namespace {

constexpr std::string_view kOp = "sdpa_varlen";
// Up to the kernels, a call allocates only bookkeeping — its checks' lists of tensors and problems,
// the split of its sequences among the kernels, the report's text —: a refusal there is
// attn::OutOfMemory saying so (it was a bare std::bad_alloc), and nothing is written yet. The
// kernels and the head-major copies name their own buffers.
constexpr const char* kBookkeeping = "sdpa_varlen's argument checks and report text";

// The errors run_forward (kernels/dispatch.cpp) would throw for sequence b (`lq` queries),
// raised before any sequence is run: an explicit kernel that declines it. (16-bit K/V need no
// check: flash reads them for any Lq. The call's own reasons — flash's, decode's dtypes,
// layouts and options — are checked once, whatever cu_seqlens hold.) A sequence without keys
// is checked too: it is refused as it would be with keys.
void require_runnable(std::int64_t lq, Impl impl, std::int64_t b) {
    if (impl == Impl::decode) {
        const std::string why = detail::decode_rows_declines(lq);
        if (!why.empty()) detail::fail(kOp, "impl: the decode kernel cannot run sequence ", b, ": ", why);
    }
}

}  // namespace

SdpaVarlenShapes sdpa_varlen_output_shapes(const TensorView& q, const TensorView& k, const TensorView& v) {
    const detail::PackedBatch p = detail::check_packed_qkv(kOp, q, k, v);
    return SdpaVarlenShapes{Shape{p.Tq, p.Hq, p.Dv}, Shape{p.Tq, p.Hq}};
}

namespace detail {

VarlenCall check_varlen_call(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const SdpaOptions& options,
                             const TensorView& out, const TensorView* lse) {
    VarlenCall r;
    // 16-bit q/k/v and out as in sdpa (make_problem per sequence; a 16-bit out is rounded once).
    r.pb = check_packed(kOp, q, k, v, cu_seqlens_q, cu_seqlens_k, options, out, lse, /*sixteen_bit_out=*/true);
    const PackedBatch& pb = r.pb;
    if (!is_floating(q.dtype())) {
        fail_type(kOp, "q: dtype must be float32, float64, float16 or bfloat16 but got ", dtype_name(q.dtype()));
    }
    // Flash declines by the dtypes and head dims, which every sequence shares: refused here,
    // whatever cu_seqlens hold (a batch whose sequences all lacked queries or keys built no problem
    // and ran float64 inputs with impl = flash, which sdpa_varlen_backward refuses).
    if (options.impl == Impl::flash) {
        const std::string why = flash_input_declines(q.dtype(), k.dtype(), v.dtype(), pb.Dk, pb.Dv);
        if (!why.empty()) fail(kOp, "impl: flash cannot run this call: ", why, "; use auto or reference");
    }
    // Decode's reasons that hold for every sequence likewise (a float64 q, dropout, …): refused
    // once here, even when no sequence has both queries and keys.
    if (options.impl == Impl::decode) {
        const std::string why = decode_call_declines(q, k, v, options.dropout_p);
        if (!why.empty()) fail(kOp, "impl: the decode kernel cannot run this call: ", why);
    }

    // Build every sequence's problem first: nothing is written until all are valid.
    for (std::size_t b = 0; b < pb.seqs.size(); ++b) {
        const PackedSequence& s = pb.seqs[b];
        if (s.lq == 0) continue;
        require_runnable(s.lq, options.impl, static_cast<std::int64_t>(b));
        if (s.lk == 0) {
            r.keyless.push_back(static_cast<std::int64_t>(b));
            continue;
        }
        const TensorView lse_b = lse ? sequence_lse(*lse, s.q0, s.lq) : TensorView{};
        r.problems.push_back(make_problem(sequence_rows(q, s.q0, s.lq), sequence_rows(k, s.k0, s.lk),
                                          sequence_rows(v, s.k0, s.lk), sequence_options(options, static_cast<std::int64_t>(b)),
                                          sequence_rows(out, s.q0, s.lq), lse ? &lse_b : nullptr, nullptr, kOp));
        r.sequence.push_back(b);
    }
    return r;
}

}  // namespace detail

void sdpa_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens_q,
                 const TensorView& cu_seqlens_k, const SdpaOptions& options, const TensorView& out,
                 const TensorView* lse, SdpaReport* report) {
    // attn::num_threads() for every kernel below: the decode and reference sequences ran on
    // OpenMP's default count (threads=1 still started a full team).
    const detail::ComputeThreads compute_threads;
    detail::VarlenCall call;
    detail::naming_bookkeeping(kBookkeeping, [&] {
        call = detail::check_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, options, out, lse);
    });
    detail::run_varlen_call(std::move(call), q, k, v, cu_seqlens_q, cu_seqlens_k, options, out, lse, report);
}

namespace detail {

void run_varlen_call(VarlenCall call, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const SdpaOptions& options,
                     const TensorView& out, const TensorView* lse, SdpaReport* report) {
    const PackedBatch& pb = call.pb;
    std::vector<SdpaProblem>& problems = call.problems;
    const std::vector<std::int64_t>& keyless = call.keyless;

    // The sequences the dispatch gives to flash run as one batch: one task list over
    // (sequence, head, query block), longest first, in one parallel region (flash.hpp
    // flash_forward_batch), the long ones on head-major copies of their K/V (head_major.hpp).
    // The others (decode, reference) run one by one or side by side (run_sequences.hpp), each
    // kernel call sizing its own buffers: they write staged outputs, copied into out and lse once
    // every sequence has run (staging.hpp), so that a refusal in a later one leaves them as they were.
    std::vector<SdpaProblem> batch;
    std::vector<std::size_t> others;
    std::vector<ForwardChoice> choices;  // others[n]'s kernel
    SequenceOrder order;                 // of others
    StagedOutputs staged;                // others[n]'s out, then its lse
    const KernelSet* flash_kernels = nullptr;
    SdpaReport whole;  // the call's report, made before anything is written
    naming_bookkeeping(kBookkeeping, [&] {
        require_outputs_apart(kOp,
                              {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&cu_seqlens_q, "cu_seqlens_q"},
                               {&cu_seqlens_k, "cu_seqlens_k"}},
                              options, {{&out, "out"}, {lse, "lse"}});
        // The checked problems may view stand-ins of these tensors (forward_packed checks before it
        // projects): each sequence's views, taken again from the tensors it runs on.
        for (std::size_t i = 0; i < problems.size(); ++i) {
            SdpaProblem& p = problems[i];
            const PackedSequence& s = pb.seqs[call.sequence[i]];
            const TensorView qs = sequence_rows(q, s.q0, s.lq), ks = sequence_rows(k, s.k0, s.lk);
            const TensorView vs = sequence_rows(v, s.k0, s.lk), os = sequence_rows(out, s.q0, s.lq);
            ATTN_DASSERT(qs.dtype() == p.q.dtype() && qs.shape() == p.q.shape() && ks.dtype() == p.k.dtype() &&
                         ks.shape() == p.k.shape() && vs.dtype() == p.v.dtype() && vs.shape() == p.v.shape() &&
                         os.dtype() == p.out.dtype() && os.shape() == p.out.shape() &&
                         (lse != nullptr) == p.lse.has_value());
            p.q = qs;
            p.k = ks;
            p.v = vs;
            p.out = os;
            if (lse != nullptr) p.lse = sequence_lse(*lse, s.q0, s.lq);
        }
        std::vector<SdpaReport> reports(report != nullptr ? problems.size() : 0);
        for (std::size_t i = 0; i < problems.size(); ++i) {
            if (runs_flash(problems[i], options.impl)) {
                batch.push_back(problems[i]);
            } else {
                others.push_back(i);
                choices.push_back(choose_forward(problems[i], options.impl, report != nullptr));
                if (report != nullptr) reports[i] = choices.back().text;
            }
        }
        for (const std::size_t i : others) {
            staged.add(problems[i].out);
            if (lse != nullptr) staged.add(*problems[i].lse);
        }
        order = order_sequences(others.size(), [&](std::size_t n) {
            return problems[others[n]].Hq * ((problems[others[n]].Lq + 63) / 64);
        });
        if (!batch.empty()) {
            std::string why_isa;
            flash_kernels = &kernel_set(&why_isa);
            if (report != nullptr) {
                const std::string name = kernel_name("flash", *flash_kernels, flash_compute(*flash_kernels, batch[0]));
                for (std::size_t i = 0; i < problems.size(); ++i)
                    if (runs_flash(problems[i], options.impl)) {
                        reports[i].kernel = name;
                        // As sdpa's report says it: why auto did not run decode on this sequence.
                        const std::string why_not_decode =
                            options.impl == Impl::automatic
                                ? "decode: declined, " + auto_decode_declines(problems[i], *flash_kernels) + "\n"
                                : std::string();
                        reports[i].explanation = why_not_decode + "ran: flash (" + name + ", " + why_isa + "; " +
                                                 dtypes_of(problems[i]) +
                                                 ") in one task list with the other flash sequences";
                    }
            }
        }
        if (report != nullptr) {
            std::map<std::string, int> count;
            for (const SdpaReport& r : reports) ++count[r.kernel];
            for (const auto& [name, n] : count) {
                whole.kernel += (whole.kernel.empty() ? "" : ", ") + name + " x" + std::to_string(n);
            }
            whole.explanation =
                std::to_string(pb.seqs.size()) + " packed sequences, " + std::to_string(problems.size()) +
                " with queries and keys, " + std::to_string(keyless.size()) + " without keys\n" +
                (reports.empty() ? std::string() : "first sequence:\n" + reports.front().explanation + "\n") + "ran: " +
                (whole.kernel.empty() ? std::string("nothing") : whole.kernel);
        }
    });
    // The copies (up to 256 MiB) before anything is written: out of memory there leaves out as it
    // was (they then live while the decode/reference sequences run too). Their lists are
    // bookkeeping; the buffer names itself.
    std::unique_ptr<HeadMajorScratch> copies;
    naming_bookkeeping(kBookkeeping, [&] { copies = head_major_kv(batch); });
    if (!others.empty()) {
        staged.allocate("sdpa_varlen's staged out and lse of its decode and reference sequences");
        const std::size_t per_sequence = lse != nullptr ? 2 : 1;
        for (std::size_t n = 0; n < others.size(); ++n) {
            SdpaProblem& p = problems[others[n]];
            p.out = staged.staged(per_sequence * n);
            if (lse != nullptr) p.lse = staged.staged(per_sequence * n + 1);
        }
    }

    run_sequences(order, [&](std::size_t n) { run_chosen(problems[others[n]], choices[n], nullptr); });
    if (!batch.empty()) flash_forward_batch(batch.data(), batch.size(), *flash_kernels);
    // Last, as they allocate nothing: the staged rows into out and lse, and the fully-masked-row
    // rule, out 0, lse −inf (σ_h with sinks).
    staged.commit();
    for (std::int64_t b : keyless) {
        const PackedSequence& s = pb.seqs[static_cast<std::size_t>(b)];
        const TensorView lse_rows = lse ? lse->slice(0, s.q0, s.lq) : TensorView{};
        fill_keyless(options, out.slice(0, s.q0, s.lq), lse ? &lse_rows : nullptr);
    }
    if (report != nullptr) *report = std::move(whole);  // a move: nothing can fail after the kernels
}

}  // namespace detail
}  // namespace attn
