// Ring attention backward over MPI. docs/ring.md ("Backward") draws it.
//
// The forward's global O and lse are all a block needs: for query rows i and a block of keys,
//   P_ij = exp(S_ij·scale − lse_i)            (lse_i over ALL keys: these are the global weights)
//   dS_ij = P_ij·(dP_ij − D_i),  D_i = rowsum(dO_i ∘ O_i)   (O_i the global output row)
// so single-process attn::sdpa_backward on (query rows, key block) with the forward's O and lse
// rows gives exactly that block's share: dQ_i += scale·Σ_j dS_ij·K_j (this rank's rows, kept
// here) and dK_j, dV_j += their sums over this rank's rows (the block's owner needs them).
//
// Per rank, in three phases:
//   1. the forward's checks (ring_setup.cpp) plus the gradients', agreed by every rank;
//   2. the ring: S = ctx.steps <= P steps (fewer under a narrow window); at step s the rank holds the K/V block of rank o = (r − s) mod P.
//      K/V travel as in the forward (Isend right / Irecv left at the start of the step, into
//      the other of two buffers). The block's dK/dV accumulator follows one step behind: the
//      rank computes its share of block o into a zeroed buffer `part` while the accumulator
//      that ranks o .. r−1 have summed arrives from the left; then acc += part and acc goes on
//      to the right (double-buffered). After step S−1 the accumulator has visited every rank that
//      sees the block and its last hop brings it home (to the right = o when S = P).
//   3. writes dQ (summed in double, in step order) and the own block's dK/dV.
// Accumulation order is fixed by the ring (block o: ranks o, o+1, …, o+P−1), so a given P gives
// bit-identical results on every run; different P sum in different orders (float32 for the
// travelling dK/dV, double for dQ): equal within the bound tests/ring states, not bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/element_io.hpp"
#include "attn/error.hpp"
#include "attn/ring.hpp"
#include "attn/sdpa_backward.hpp"
#include "block_plan.hpp"
#include "ring_call.hpp"
#include "ring_setup.hpp"

namespace attn::dist {
namespace {

using attn::detail::fail;
using attn::detail::fail_type;
constexpr std::string_view kOp = "ring_attention_backward";
constexpr int kTagKV = 7102, kTagGrad = 7103;

// The gradients' checks on this rank (the forward's run first, in setup_ring).
void check_gradients(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const TensorView& lse, const TensorView& grad_out, const RingOptions& o, const TensorView& dq,
                     const TensorView& dk, const TensorView& dv, const TensorView* dsinks) {
    const struct {
        const TensorView* t;
        const char* name;
        const TensorView* like;
        const char* like_name;
    } grads[] = {{&grad_out, "grad_out", &out, "out"}, {&dq, "dq", &q, "Q"}, {&dk, "dk", &k, "K"}, {&dv, "dv", &v, "V"}};
    for (const auto& g : grads) {
        attn::detail::require_data(kOp, *g.t, g.name);
        const DType t = g.t->dtype();
        if (t != DType::f32 && t != DType::f16 && t != DType::bf16) {
            fail_type(kOp, g.name, ": dtype must be float32, float16 or bfloat16 (ring attention computes in float32) but got ",
                 dtype_name(t));
        }
        if (!(g.t->shape() == g.like->shape())) {
            fail(kOp, g.name, ": expected the shape of ", g.like_name, " ", g.like->shape(), " but got ", g.t->shape());
        }
    }
    // A rank without rows has empty gradients (zero strides): the check passes them over.
    attn::detail::require_gradient_outputs(kOp,
                                           {{&q, "Q"}, {&k, "K"}, {&v, "V"}, {&out, "out"}, {&lse, "lse"}, {&grad_out, "grad_out"}},
                                           {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}}, dsinks,
                                           attn::detail::view_or_null(o.sinks), q.dim(1));
    // The local backward kernel must accept these calls: probe it on one zero row now, so that it
    // cannot refuse inside the ring.
    // The inputs' own dtypes; float32 gradients, as the ring's block calls write them.
    const std::int64_t Dk = q.dim(3), Dv = v.dim(3);
    Tensor zq(q.dtype(), Shape{1, 1, 1, Dk}, true), zk(k.dtype(), Shape{1, 1, 1, Dk}, true),
        zv(v.dtype(), Shape{1, 1, 1, Dv}, true), zo(out.dtype(), Shape{1, 1, 1, Dv}, true),
        zg(grad_out.dtype(), Shape{1, 1, 1, Dv}, true);
    Tensor zl(DType::f32, Shape{1, 1, 1}, true), gq(DType::f32, Shape{1, 1, 1, Dk}), gk(DType::f32, Shape{1, 1, 1, Dk}),
        gv(DType::f32, Shape{1, 1, 1, Dv});
    SdpaOptions so;
    so.impl = o.impl;
    SdpaReport report;
    try {
        sdpa_backward(zq, zk, zv, zo, zl, zg, so, gq, gk, gv, &report);
    } catch (const Error& e) {
        attn::detail::fail_as(e.kind(), kOp, e.what());
    }
    // Each block's call must take P from the global lse and D from the global out, as the flash
    // backward does; the reference backward recomputes the softmax over the block's own keys, so
    // its block gradients would not add up to the whole sequence's (O(1) errors in dQ).
    if (report.kernel == "reference-backward") {
        fail(kOp, "impl: the reference backward normalises each block over its own keys, but the ring's blocks need the "
                  "global lse and out; use impl auto or flash");
    }
}

}  // namespace

void ring_attention_backward(MPI_Comm user_comm, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& lse, const TensorView& grad_out,
                             const RingOptions& options, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             RingStats* stats, const TensorView* dsinks) {
    detail::RingCall call(user_comm, kOp);  // threads, no interruption, start time, private comm (ring_call.hpp)
    detail::RingContext& ctx = call.ctx;
    // ---- phase 1: checks, agreed by all ranks ----
    detail::setup_ring(ctx, kOp, q, k, v, options, out, &lse, attn::detail::OutLse::read, [&] {
        check_gradients(q, k, v, out, lse, grad_out, options, dq, dk, dv, dsinks);
        if (dsinks != nullptr) ctx.mine.tensor_modifiers |= detail::kWantsDsinks;  // compared across ranks
        ctx.mine.backward = 1;  // a rank in the forward would wait for ever: compared too
    });
    const MPI_Comm comm = ctx.comm;
    const int P = ctx.P, rank = ctx.rank;
    const std::int64_t B = ctx.mine.B, Hq = ctx.mine.Hq, Hkv = ctx.mine.Hkv, Dk = ctx.mine.Dk, Dv = ctx.mine.Dv,
                       nq = ctx.mine.nq;
    const std::int64_t kw = ctx.k_words_per_row;

    // Buffers (collectively: an allocation failure is every rank's error): K/V blocks and dK/dV
    // accumulators, two each; this step's share `part`; dQ in double; lse as float32 rows (the
    // flash backward reads float32); one call's gradients.
    Tensor buf[2], grad[2], part, lse32, tq, tk, tv, tl;
    std::vector<double> acc_dq;
    run_collectively(comm, [&] {
        const std::int64_t words = std::max<std::int64_t>(1, ctx.nk_max * (ctx.k_words_per_row + ctx.v_words_per_row));
        for (Tensor& t : buf) t = Tensor(DType::f32, Shape{(ctx.buffer_bytes() + 3) / 4}, "the ring's K/V block buffers");  // K/V in their dtypes
        for (Tensor& t : grad) t = Tensor(DType::f32, Shape{words}, "the ring's dK/dV accumulators");
        part = Tensor(DType::f32, Shape{words}, "the ring's dK/dV share of one step");
        attn::detail::resize_or_throw(acc_dq, B * Hq * nq * Dk, "the ring's dQ accumulator acc_dq (B, Hq, L_local, Dk) in double");
        lse32 = Tensor(DType::f32, Shape{B, Hq, nq}, "the ring's float32 copy of lse");
        tq = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hq * ctx.q_seg_max * Dk)}, "the ring's block dQ");
        tk = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hkv * ctx.nk_max * Dk)}, "the ring's block dK");
        tv = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hkv * ctx.nk_max * Dv)}, "the ring's block dV");
        if (!ctx.slopes.empty())
            tl = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hq * ctx.q_seg_max)}, "the ring's block lse with ALiBi's shift");
    });
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t i = 0; i < nq; ++i)
                lse32.data_as<float>()[(b * Hq + h) * nq + i] = static_cast<float>(lse.load_as_double(lse.offset(b, h, i)));

    detail::pack(k, buf[0].data());
    detail::pack(v, static_cast<char*>(buf[0].data()) + ctx.v_offset(ctx.rank));

    // ---- phase 2: the ring (a failure here cannot be agreed on: it aborts, as in the forward) ----
    try {
        // Softcap: every block differentiates through it. Sinks: the global lse already holds
        // them (P_ij = e^{s_ij − lse_i} are the global weights), so the blocks need no sink; the
        // sink's own gradient is summed over the ranks below.
        // Dropout: each block regenerates the forward's keep mask at its origin (block_options);
        // D_i = rowsum(dO ∘ O) with the global dropped O is what FlashAttention-2's dropout
        // backward uses, so the blocks' shares add up to sdpa_backward's.
        const SdpaOptions sopt = detail::block_base_options(options, ctx);
        RingStats st;
        st.steps = ctx.steps;
        const int S = ctx.steps;
        const int right = (rank + 1) % P, left = (rank - 1 + P) % P;
        // req: 0 next K/V block (recv), 1 this K/V block (send), 2 this block's dK/dV
        // accumulator (recv), 3 the previous step's accumulator (send).
        MPI_Request req[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        auto poke = [&] {
            int done = 0;  // without a progress thread MPI moves large messages only inside MPI calls
            MPI_Testall(4, req, &done, MPI_STATUSES_IGNORE);
        };
        auto wait = [&](int i) {
            const auto t = detail::Clock::now();
            MPI_Wait(&req[i], MPI_STATUS_IGNORE);
            st.wait_seconds += detail::since(t);
        };
        int cur = 0;
        for (int s = 0; s < S; ++s) {
            const int origin = (rank - s + P) % P;
            const int g = s % 2;
            const std::int64_t words = ctx.block_words(origin), nk_o = ctx.nk(origin);
            if (s + 1 < S) {
                const int next_origin = (rank - s - 1 + P) % P;
                // K/V in their own dtypes (16-bit: half the bytes); the dK/dV sums below stay float32.
                MPI_Irecv(buf[1 - cur].data(), static_cast<int>(ctx.block_units(next_origin)), ctx.unit.type, left, kTagKV,
                          comm, &req[0]);
                MPI_Isend(buf[cur].data(), static_cast<int>(ctx.block_units(origin)), ctx.unit.type, right, kTagKV, comm,
                          &req[1]);
                st.bytes_sent += ctx.block_bytes(origin);
            }
            if (s > 0) MPI_Irecv(grad[g].data(), static_cast<int>(words), MPI_FLOAT, left, kTagGrad, comm, &req[2]);

            const auto t_compute = detail::Clock::now();
            const double cpu_compute = detail::cpu_now();
            float* pk = part.data_as<float>();
            std::fill(pk, pk + words, 0.0f);
            float* pv = pk + nk_o * kw;
            const TensorView kb = ctx.k_view(buf[cur].data(), origin), vb = ctx.v_view(buf[cur].data(), origin);
            for (const detail::Placed& qs : ctx.q_segs) {
                if (qs.g.length == 0) continue;
                for (const detail::Placed& ks : ctx.k_segs(origin)) {
                    if (ks.g.length == 0) continue;
                    // Pieces of at most kPokeRows rows: poke() between them moves the transfers on.
                    for (const detail::BlockCall& whole : detail::plan_block(ctx.bands, qs.g, ks.g))
                    for (const detail::BlockCall& c : detail::split_rows(whole, detail::kPokeRows)) {
                        const SdpaOptions o = detail::block_options(sopt, c);
                        const std::int64_t row = qs.local + c.row0, key = ks.local + c.key0;
                        auto rows = [&](const TensorView& t) { return t.slice(0, c.b0, c.nb).slice(2, row, c.rows); };
                        auto keys = [&](const TensorView& t) { return t.slice(0, c.b0, c.nb).slice(2, key, c.keys); };
                        const TensorView gq(tq.data(), DType::f32, Shape{c.nb, Hq, c.rows, Dk});
                        const TensorView gk(tk.data(), DType::f32, Shape{c.nb, Hkv, c.keys, Dk});
                        const TensorView gv(tv.data(), DType::f32, Shape{c.nb, Hkv, c.keys, Dv});
                        SdpaReport report;
                        // ALiBi measured from the band's edge: the call's scores are too high by
                        // m·alibi_shift (block_plan.hpp), so it gets the lse raised by as much.
                        TensorView lse_rows = rows(lse32.view());
                        if (!ctx.slopes.empty()) {
                            float* d = tl.data_as<float>();
                            for (std::int64_t bh = 0; bh < c.nb * Hq; ++bh)
                                for (std::int64_t a = 0; a < c.rows; ++a)
                                    d[bh * c.rows + a] = static_cast<float>(
                                        static_cast<double>(lse32.data_as<const float>()[(c.b0 * Hq + bh) * nq + row + a]) +
                                        ctx.alibi_excess(c, c.b0 + bh / Hq, bh % Hq));
                            lse_rows = TensorView(tl.data(), DType::f32, Shape{c.nb, Hq, c.rows});
                        }
                        sdpa_backward(rows(q), keys(kb), keys(vb), rows(out), lse_rows, rows(grad_out), o, gq, gk, gv,
                                      &report);
                        st.kernel = report.kernel;
                        ++st.sdpa_calls;
                        st.score_entries += Hq * c.visible;
                        // dQ rows: this rank's, summed in double in (step, segment, call) order.
                        const float* sq = tq.data_as<const float>();
                        for (std::int64_t bh = 0; bh < c.nb * Hq; ++bh)
                            for (std::int64_t a = 0; a < c.rows; ++a) {
                                double* d = acc_dq.data() + ((c.b0 * Hq + bh) * nq + row + a) * Dk;
                                const float* x = sq + (bh * c.rows + a) * Dk;
                                for (std::int64_t e = 0; e < Dk; ++e) d[e] += x[e];
                            }
                        // dK/dV rows of the block (laid out like the K/V buffer).
                        const float* sk = tk.data_as<const float>();
                        const float* sv = tv.data_as<const float>();
                        for (std::int64_t bh = 0; bh < c.nb * Hkv; ++bh)
                            for (std::int64_t j = 0; j < c.keys; ++j) {
                                const std::int64_t r = (c.b0 * Hkv + bh) * nk_o + key + j;
                                for (std::int64_t e = 0; e < Dk; ++e) pk[r * Dk + e] += sk[(bh * c.keys + j) * Dk + e];
                                for (std::int64_t e = 0; e < Dv; ++e) pv[r * Dv + e] += sv[(bh * c.keys + j) * Dv + e];
                            }
                        poke();
                    }
                }
            }
            st.compute_seconds += detail::since(t_compute);
            st.compute_cpu_seconds += detail::cpu_now() - cpu_compute;

            // The accumulator: ranks origin .. r−1 summed so far (from the left) + this rank's part.
            float* acc = grad[g].data_as<float>();
            if (s > 0) {
                wait(2);
                for (std::int64_t i = 0; i < words; ++i) acc[i] += pk[i];
            } else {
                std::copy(pk, pk + words, acc);
            }
            wait(3);  // grad[1 − g] (sent last step) is received into next step
            // On to the next rank holding this block, or home from the last one (the right
            // neighbour when the ring runs all P steps).
            if (S > 1) {
                MPI_Isend(acc, static_cast<int>(words), MPI_FLOAT, s + 1 < S ? right : origin, kTagGrad, comm, &req[3]);
                st.bytes_sent += words * static_cast<std::int64_t>(sizeof(float));
            }
            wait(0);
            wait(1);
            cur = 1 - cur;
        }
        // The own block's accumulator comes home from its last stop, rank r + S − 1 (the left
        // neighbour when S = P).
        const float* home = grad[0].data_as<const float>();
        if (S > 1) {
            const int g = S % 2, last = (rank + S - 1) % P;
            MPI_Irecv(grad[g].data(), static_cast<int>(ctx.block_words(rank)), MPI_FLOAT, last, kTagGrad, comm, &req[2]);
            wait(2);
            wait(3);
            home = grad[g].data_as<const float>();
        }

        // dσ_h = −Σ_{b,i} e^{σ_h − lse_{b,h,i}}·rowsum(dO ∘ O) over the whole sequence: each rank
        // sums its rows in double, then every rank adds the P partial sums in rank order (not
        // MPI_Allreduce, whose order is the library's): the same bits on every rank and run.
        std::vector<double> dsink;
        if (dsinks != nullptr) {
            std::vector<double> mine(static_cast<std::size_t>(Hq), 0.0), all(static_cast<std::size_t>(P * Hq));
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t h = 0; h < Hq; ++h)
                    for (std::int64_t i = 0; i < nq; ++i) {
                        double D = 0;
                        for (std::int64_t e = 0; e < Dv; ++e)
                            D += attn::detail::load(grad_out, grad_out.offset(b, h, i, e)) *
                                 attn::detail::load(out, out.offset(b, h, i, e));
                        const double l = lse.load_as_double(lse.offset(b, h, i));
                        mine[static_cast<std::size_t>(h)] -= std::exp(ctx.sinks[static_cast<std::size_t>(h)] - l) * D;
                    }
            MPI_Allgather(mine.data(), static_cast<int>(Hq), MPI_DOUBLE, all.data(), static_cast<int>(Hq), MPI_DOUBLE, comm);
            dsink.assign(static_cast<std::size_t>(Hq), 0.0);
            for (int r = 0; r < P; ++r)
                for (std::int64_t h = 0; h < Hq; ++h) dsink[static_cast<std::size_t>(h)] += all[static_cast<std::size_t>(r * Hq + h)];
        }

        // ---- phase 3: results ----
        for (std::int64_t h = 0; h < static_cast<std::int64_t>(dsink.size()); ++h) {
            if (dsinks->dtype() == DType::f32) dsinks->data_as<float>()[dsinks->offset(h)] = static_cast<float>(dsink[static_cast<std::size_t>(h)]);
            else dsinks->data_as<double>()[dsinks->offset(h)] = dsink[static_cast<std::size_t>(h)];
        }
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < Hq; ++h)
                for (std::int64_t i = 0; i < nq; ++i) {
                    const double* x = acc_dq.data() + ((b * Hq + h) * nq + i) * Dk;
                    // 16-bit gradients: the float32 one rounded once more (detail::store).
                    for (std::int64_t e = 0; e < Dk; ++e) attn::detail::store(dq, dq.offset(b, h, i, e), x[e]);
                }
        const std::int64_t nk = ctx.mine.nk;
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < Hkv; ++h)
                for (std::int64_t j = 0; j < nk; ++j) {
                    const std::int64_t r = (b * Hkv + h) * nk + j;
                    for (std::int64_t e = 0; e < Dk; ++e) attn::detail::store(dk, dk.offset(b, h, j, e), home[r * Dk + e]);
                    for (std::int64_t e = 0; e < Dv; ++e) attn::detail::store(dv, dv.offset(b, h, j, e), home[nk * kw + r * Dv + e]);
                }
        st.total_seconds = detail::since(call.start);
        if (stats != nullptr) *stats = st;
    } catch (const std::exception& e) {
        detail::abort_ring(comm, kOp, rank, e);
    }
}

}  // namespace attn::dist
