// The textbook gradient of attention, in double: the oracle the tiled backward is tested
// against. It uses the softmax Jacobian directly (no saved lse, no Dᵢ trick), so the two
// paths share only the forward's definition.
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include <omp.h>

#include "attn/error.hpp"
#include "../../core/allocate.hpp"
#include "../../core/dropout.hpp"
#include "../../core/interrupt.hpp"
#include "../../core/parallel_for.hpp"
#include "../../core/element_io.hpp"
#include "../reference/reference.hpp"
#include "backward.hpp"

namespace attn::detail {
namespace {

// Rows of a (B, H, L, D) view for one (b, h), as a dense L×D double matrix in m.
void load_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t L, std::int64_t D, std::vector<double>& m) {
    m.resize(static_cast<std::size_t>(L * D));
    for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t d = 0; d < D; ++d) m[static_cast<std::size_t>(i * D + d)] = load(t, t.offset(b, h, i, d));
}

// A thread's buffers for its tasks, reserved before the first gradient is written (as the
// forward's HeadSteps): an allocation the system refuses then leaves every gradient as it was.
struct TaskBuffers {
    HeadSteps s;                       // the forward of one query head (A = s.weights)
    std::vector<double> K, V, dK, dV;  // the KV head's rows (Lk, D) and their gradients
    std::vector<double> Q, dO, dQ, dA; // one query head's rows (Lq, D), dQ, and one row of dA (Lk)
};

void reserve_task_buffers(const SdpaProblem& p, TaskBuffers& w) {
    reserve_head_steps(p, w.s);
    reserving(p, [&] {
        for (auto [v, n] : {std::pair{&w.K, p.Lk * p.Dk}, {&w.V, p.Lk * p.Dv}, {&w.dK, p.Lk * p.Dk}, {&w.dV, p.Lk * p.Dv},
                            {&w.Q, p.Lq * p.Dk}, {&w.dO, p.Lq * p.Dv}, {&w.dQ, p.Lq * p.Dk}, {&w.dA, p.Lk}})
            v->reserve(static_cast<std::size_t>(n));
    });
}

void store_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t L, std::int64_t D,
                const std::vector<double>& m) {
    for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t d = 0; d < D; ++d) store(t, t.offset(b, h, i, d), m[static_cast<std::size_t>(i * D + d)]);
}

}  // namespace

// One task per (b, KV head): dK and dV sum over the `group` query heads reading it.
void reference_backward(const BackwardProblem& bp) {
    const SdpaProblem& p = bp.fwd;
    SdpaProblem undropped = p;  // the reference forward's A before dropout
    undropped.dropout_p = 0.0;
    const Dropout drop = p.dropout();
    const std::int64_t Lq = p.Lq, Lk = p.Lk, Dk = p.Dk, Dv = p.Dv;
    const std::int64_t tasks = p.B * p.Hkv;
    // dσ per (b, h), summed over b at the end in order (deterministic).
    std::vector<double> dsinks;
    resize_or_throw(dsinks, p.B * p.Hq, "the reference backward's sink gradients of every (batch, head)");  // zeros
    const int threads = team_size(tasks);
    std::vector<TaskBuffers> buffers;
    resize_or_throw(buffers, threads, "the reference backward's list of per-thread buffers");  // empty until reserved here:
    for (TaskBuffers& w : buffers) reserve_task_buffers(p, w);             // every one before any write
    // The caller's flag (interrupt.hpp), read once per query row as the forward's steps read it:
    // one head can take minutes.
    const Interrupt stop;
    const auto task = [&](std::int64_t t) {
        TaskBuffers& mine = buffers[static_cast<std::size_t>(omp_get_thread_num())];
        std::vector<double>& K = mine.K;
        std::vector<double>& V = mine.V;
        std::vector<double>& dK = mine.dK;
        std::vector<double>& dV = mine.dV;
        std::vector<double>& dA = mine.dA;
        std::vector<double>& Q = mine.Q;
        std::vector<double>& dO = mine.dO;
        std::vector<double>& dQ = mine.dQ;
        HeadSteps& s = mine.s;
        const std::int64_t b = t / p.Hkv, hk = t % p.Hkv;
        double* dsig = dsinks.data() + b * p.Hq;
        load_rows(p.k, b, hk, Lk, Dk, K);  // (Lk, Dk)
        load_rows(p.v, b, hk, Lk, Dv, V);  // (Lk, Dv)
        dK.assign(static_cast<std::size_t>(Lk * Dk), 0.0);
        dV.assign(static_cast<std::size_t>(Lk * Dv), 0.0);
        dA.resize(static_cast<std::size_t>(Lk));
        for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
            reference_head(undropped, b, h, s, stop);  // s.weights = A (Lq, Lk)
            load_rows(p.q, b, h, Lq, Dk, Q);           // (Lq, Dk)
            load_rows(bp.grad_out, b, h, Lq, Dv, dO);  // (Lq, Dv)
            dQ.assign(static_cast<std::size_t>(Lq * Dk), 0.0);
            for (std::int64_t i = 0; i < Lq; ++i) {
                stop.stop_if_requested();
                const double* A = s.weights.data() + i * Lk;
                const double* dOi = dO.data() + i * Dv;
                // dA[j] = Z/(1−p) · dO[i]·V[j];  dV[j] += A[i][j]·Z/(1−p) · dO[i]
                double r = 0.0;  // rowsum(A ∘ dA)
                for (std::int64_t j = 0; j < Lk; ++j) {
                    dA[static_cast<std::size_t>(j)] = 0.0;
                    if (A[j] == 0.0) continue;  // masked: no gradient flows (even through an inf in V)
                    const double f = drop.factor(b, h, i, j);
                    double dot = 0.0;
                    for (std::int64_t d = 0; d < Dv; ++d) dot += dOi[d] * V[static_cast<std::size_t>(j * Dv + d)];
                    dA[static_cast<std::size_t>(j)] = f * dot;
                    r += A[j] * dA[static_cast<std::size_t>(j)];
                    const double w = A[j] * f;
                    for (std::int64_t d = 0; d < Dv; ++d) dV[static_cast<std::size_t>(j * Dv + d)] += w * dOi[d];
                }
                // Sinks: the sink's weight e^{σ − lse} with dA = 0 (backward.hpp)
                if (p.sinks) dsig[static_cast<std::size_t>(h)] -= std::exp(static_cast<double>(p.sink(h)) - s.lse[static_cast<std::size_t>(i)]) * r;
                // dS[j] = A[j]·(dA[j] − r)·(1 − tanh²(s/c));  dQ[i] += scale·dS[j]·K[j];  dK[j] += scale·dS[j]·Q[i]
                const double* capped = s.softcapped_scores.data() + i * Lk;
                for (std::int64_t j = 0; j < Lk; ++j) {
                    if (A[j] == 0.0) continue;
                    double ds = p.scale * A[j] * (dA[static_cast<std::size_t>(j)] - r);
                    if (p.softcap > 0.0) {
                        const double th = capped[j] / p.softcap;
                        ds *= 1.0 - th * th;
                    }
                    for (std::int64_t d = 0; d < Dk; ++d) {
                        dQ[static_cast<std::size_t>(i * Dk + d)] += ds * K[static_cast<std::size_t>(j * Dk + d)];
                        dK[static_cast<std::size_t>(j * Dk + d)] += ds * Q[static_cast<std::size_t>(i * Dk + d)];
                    }
                }
            }
            store_rows(bp.dq, b, h, Lq, Dk, dQ);
        }
        store_rows(bp.dk, b, hk, Lk, Dk, dK);
        store_rows(bp.dv, b, hk, Lk, Dv, dV);
    };
    parallel_for_may_throw(tasks, threads, task);  // allocates nothing: the buffers are reserved
    if (bp.dsinks)
        for (std::int64_t h = 0; h < p.Hq; ++h) {
            double acc = 0.0;
            for (std::int64_t b = 0; b < p.B; ++b) acc += dsinks[static_cast<std::size_t>(b * p.Hq + h)];
            store(*bp.dsinks, bp.dsinks->offset(h), acc);
        }
}

}  // namespace attn::detail
