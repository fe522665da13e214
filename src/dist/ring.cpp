// Ring attention over MPI. docs/ring.md has the pictures (layouts, block kinds, the ring).
//
// Per rank, in three phases:
//   1. checks, all inside run_collectively so every rank agrees before anything is written
//      (ring_setup.cpp, shared with the backward); the K/V ring buffers and accumulators are
//      allocated here too;
//   2. the ring: P steps (fewer when no rank sees a block further away: ctx.steps); at step s the rank holds the K/V block of rank (r − s) mod P, posts
//      MPI_Irecv (next block, from the left) and MPI_Isend (this block, to the right) into
//      the other of two buffers, computes this block with attn::sdpa per (query segment,
//      key segment) pair, merges by log-sum-exp, then waits for the transfer;
//   3. writes out (and lse) from the accumulators.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "attn/error.hpp"
#include "attn/ring.hpp"
#include "block_plan.hpp"
#include "../core/allocate.hpp"
#include "../core/element_io.hpp"
#include "../kernels/dispatch.hpp"
#include "../sdpa/problem.hpp"
#include "ring_call.hpp"
#include "ring_setup.hpp"

namespace attn::dist {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int kTagKV = 7101;
constexpr std::string_view kOp = "ring_attention";

}  // namespace

void run_collectively(MPI_Comm comm, const std::function<void()>& fn) {
    detail::require_intracommunicator(comm, "run_collectively");  // MPI_COMM_NULL aborted the job in agree
    detail::agree(comm, fn);
}

void ring_attention(MPI_Comm user_comm, const TensorView& q, const TensorView& k, const TensorView& v,
                    const RingOptions& options, const TensorView& out, const TensorView* lse, RingStats* stats) {
    detail::RingCall call(user_comm, kOp);  // threads, no interruption, start time, private comm (ring_call.hpp)
    detail::RingContext& ctx = call.ctx;
    // ---- phase 1: checks, agreed by all ranks (ring_setup.cpp) ----
    detail::setup_ring(ctx, kOp, q, k, v, options, out, lse, attn::detail::OutLse::written, nullptr);
    const MPI_Comm comm = ctx.comm;
    const int P = ctx.P, rank = ctx.rank;
    const std::int64_t B = ctx.mine.B, Hq = ctx.mine.Hq, Dv = ctx.mine.Dv,
                       nq = ctx.mine.nq;
    const auto& q_segs = ctx.q_segs;

    // The K/V ring buffers and accumulators, allocated collectively (an allocation failure is
    // attn::OutOfMemory on every rank, not a hang for the other ranks), each named in it.
    Tensor buf[2];
    std::vector<double> acc_o, acc_lse;
    Tensor tmp_o, tmp_lse;
    run_collectively(comm, [&] {
        // K/V in their own dtypes (16-bit blocks: half the bytes on the wire); kernels read them as they are.
        for (Tensor& t : buf) t = Tensor(DType::f32, Shape{(ctx.buffer_bytes() + 3) / 4}, "the ring's K/V block buffers");
        attn::detail::resize_or_throw(acc_o, B * Hq * nq * Dv, "the ring's output accumulator acc_o (B, Hq, L_local, Dv) in double");
        attn::detail::resize_or_throw(acc_lse, B * Hq * nq, "the ring's lse accumulator acc_lse (B, Hq, L_local) in double");
        std::fill(acc_lse.begin(), acc_lse.end(), kNegInf);
        // A sink is one more softmax entry with logit σ_h and value 0: it starts every row's
        // accumulator (O = 0, ℓ = σ_h), so the merges below count it exactly once per row.
        if (!ctx.sinks.empty())
            for (std::int64_t bh = 0; bh < B * Hq; ++bh)
                std::fill_n(acc_lse.begin() + bh * nq, nq, ctx.sinks[static_cast<std::size_t>(bh % Hq)]);
        tmp_o = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hq * ctx.q_seg_max * Dv)}, "the ring's block output tmp_o");
        tmp_lse = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hq * ctx.q_seg_max)}, "the ring's block lse tmp_lse");
    });

    // ---- phase 2: the ring ----
    // A buffer holds one rank's block: K (B, Hkv, nk, Dk) then V (B, Hkv, nk, Dv), contiguous,
    // each in its dtype (ctx.k_view / ctx.v_view).
    detail::pack(k, buf[0].data());
    detail::pack(v, static_cast<char*>(buf[0].data()) + ctx.v_offset(ctx.rank));

    // From here on every rank is inside the ring: a failure on one rank cannot be agreed on
    // (its peers wait in MPI calls), so it aborts the job. The checks above make this a
    // should-not-happen path.
    try {
        // Dropout comes after the softmax and the merge is linear in each block's dropped output
        // (its lse is the undropped one): the blocks, each at its origin (block_options), give
        // exactly single-process sdpa's dropped O.
        const SdpaOptions sopt = detail::block_base_options(options, ctx);
        // As single-process sdpa decides it (make_problem): all four tensors bfloat16.
        const bool bf16_products = attn::detail::asks_bf16_products(q.dtype(), k.dtype(), v.dtype(), out.dtype());
        RingStats st;
        st.steps = ctx.steps;
        const int right = (rank + 1) % P, left = (rank - 1 + P) % P;
        int cur = 0;
        for (int s = 0; s < ctx.steps; ++s) {
            const int origin = (rank - s + P) % P;  // whose K/V block this rank holds at step s
            MPI_Request req[2];
            int nreq = 0;
            if (s + 1 < ctx.steps) {
                const int next_origin = (rank - s - 1 + P) % P;  // = the left neighbour's block now
                MPI_Irecv(buf[1 - cur].data(), static_cast<int>(ctx.block_units(next_origin)), ctx.unit.type, left, kTagKV, comm,
                          &req[nreq++]);
                MPI_Isend(buf[cur].data(), static_cast<int>(ctx.block_units(origin)), ctx.unit.type, right, kTagKV, comm, &req[nreq++]);
                st.bytes_sent += ctx.block_bytes(origin);
            }
            const auto t_compute = detail::Clock::now();
            const double cpu_compute = detail::cpu_now();
            const TensorView kb = ctx.k_view(buf[cur].data(), origin), vb = ctx.v_view(buf[cur].data(), origin);
            for (const detail::Placed& qs : q_segs) {
                if (qs.g.length == 0) continue;
                for (const detail::Placed& ks : ctx.k_segs(origin)) {
                    if (ks.g.length == 0) continue;
                    for (const detail::BlockCall& whole : detail::plan_block(ctx.bands, qs.g, ks.g))
                    for (const detail::BlockCall& c : detail::split_rows(whole, detail::kPokeRows)) {
                        const SdpaOptions o = detail::block_options(sopt, c);
                        const TensorView qv = q.slice(0, c.b0, c.nb).slice(2, qs.local + c.row0, c.rows);
                        const TensorView kv = kb.slice(0, c.b0, c.nb).slice(2, ks.local + c.key0, c.keys);
                        const TensorView vv = vb.slice(0, c.b0, c.nb).slice(2, ks.local + c.key0, c.keys);
                        const TensorView ov(tmp_o.data(), DType::f32, Shape{c.nb, Hq, c.rows, Dv});
                        const TensorView lv(tmp_lse.data(), DType::f32, Shape{c.nb, Hq, c.rows});
                        SdpaReport report;
                        // attn::sdpa's problem (make_problem: every check), plus bf16 compute when the
                        // caller's Q, K, V and out are all bfloat16: the float32 block output is the ring's
                        // own temporary (the merge runs on it with lse), not the caller's choice of
                        // dtype, so it must not turn the bf16 products off (docs/ring.md, "bf16").
                        attn::detail::SdpaProblem block = attn::detail::make_problem(qv, kv, vv, o, ov, &lv, nullptr);
                        block.bf16_products = bf16_products;
                        attn::detail::run_forward(block, o.impl, &report);
                        st.kernel = report.kernel;
                        ++st.sdpa_calls;
                        st.score_entries += Hq * c.visible;

                        // Merge by log-sum-exp: with m = max(ℓ, ℓ'),
                        //   O ← (e^{ℓ−m}·O + e^{ℓ'−m}·O') / (e^{ℓ−m} + e^{ℓ'−m}),  ℓ ← m + log(e^{ℓ−m} + e^{ℓ'−m}).
                        // A row that saw no key here has ℓ' = −inf and changes nothing.
                        const float* po = tmp_o.data_as<const float>();
                        const float* pl = tmp_lse.data_as<const float>();
                        for (std::int64_t bh = 0; bh < c.nb * Hq; ++bh) {
                            for (std::int64_t a = 0; a < c.rows; ++a) {
                                // ALiBi measured from the band's edge: the block's lse is too high by
                                // m·alibi_shift (block_plan.hpp), its output is right.
                                const double l_new = pl[bh * c.rows + a] - ctx.alibi_excess(c, c.b0 + bh / Hq, bh % Hq);
                                if (l_new == kNegInf) continue;
                                const std::int64_t row = (c.b0 * Hq + bh) * nq + qs.local + c.row0 + a;
                                double& l_acc = acc_lse[static_cast<std::size_t>(row)];
                                double* o_acc = acc_o.data() + row * Dv;
                                const float* o_new = po + (bh * c.rows + a) * Dv;
                                if (l_acc == kNegInf) {
                                    for (std::int64_t d = 0; d < Dv; ++d) o_acc[d] = o_new[d];
                                    l_acc = l_new;
                                    continue;
                                }
                                const double m = std::max(l_acc, l_new);
                                const double wa = std::exp(l_acc - m), wn = std::exp(l_new - m), sum = wa + wn;
                                for (std::int64_t d = 0; d < Dv; ++d) o_acc[d] = (wa * o_acc[d] + wn * o_new[d]) / sum;
                                l_acc = m + std::log(sum);
                            }
                        }
                        // Without a progress thread, MPI moves a large message only inside MPI calls:
                        // poke it between calls (pieces of at most kPokeRows rows) so the transfer
                        // overlaps this step's compute.
                        if (nreq > 0) {
                            int done = 0;
                            MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);
                            if (done) nreq = 0;
                        }
                    }
                }
            }
            st.compute_seconds += detail::since(t_compute);
            st.compute_cpu_seconds += detail::cpu_now() - cpu_compute;
            if (nreq > 0) {
                const auto t_wait = detail::Clock::now();
                MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
                st.wait_seconds += detail::since(t_wait);
            }
            cur = 1 - cur;
        }

        // ---- phase 3: results ----
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < Hq; ++h)
                for (std::int64_t i = 0; i < nq; ++i) {
                    const std::int64_t row = (b * Hq + h) * nq + i;
                    const double* o = acc_o.data() + row * Dv;
                    // A 16-bit out is the float32 result rounded once more (detail::store).
                    for (std::int64_t d = 0; d < Dv; ++d) attn::detail::store(out, out.offset(b, h, i, d), o[d]);
                    if (lse != nullptr) {
                        const double l = acc_lse[static_cast<std::size_t>(row)];
                        if (lse->dtype() == DType::f32) lse->data_as<float>()[lse->offset(b, h, i)] = static_cast<float>(l);
                        else lse->data_as<double>()[lse->offset(b, h, i)] = l;
                    }
                }
        st.total_seconds = detail::since(call.start);
        if (stats != nullptr) *stats = st;
    } catch (const std::exception& e) {
        detail::abort_ring(comm, kOp, rank, e);
    }
}

}  // namespace attn::dist
