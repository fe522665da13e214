#include "reference.hpp"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "attn/error.hpp"
#include "../../core/allocate.hpp"
#include "../../core/checked_size.hpp"
#include "../../core/dropout.hpp"
#include "../../core/interrupt.hpp"
#include "../../core/parallel_for.hpp"
#include "../../core/element_io.hpp"
#include "../scores.hpp"

namespace attn::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Every step reads the caller's interrupt flag once per query row (stop.stop_if_requested()):
// one head of 16384 queries and keys takes minutes here, and the flag must not wait for it.

// m = `rows` rows of `cols` copied from src (zeros when src is null), a row at a time with the
// flag read before each: the first touch of a head's Lq × Lk doubles alone (2 GiB at 16384)
// takes seconds. m's capacity is reserved (reserve_head_steps): nothing is reallocated.
void assign_rows(std::vector<double>& m, std::int64_t rows, std::int64_t cols, const double* src, const Interrupt& stop) {
    m.clear();
    for (std::int64_t i = 0; i < rows; ++i) {
        stop.stop_if_requested();
        if (src == nullptr) m.insert(m.end(), static_cast<std::size_t>(cols), 0.0);
        else m.insert(m.end(), src + i * cols, src + (i + 1) * cols);
    }
}

// Step 1 — scores: S[i][j] = scale · Σ_d Q[i][d]·K[j][d]
void compute_scores(const SdpaProblem& p, std::int64_t b, std::int64_t h, std::vector<double>& S,
                    std::vector<double>& qrow, const Interrupt& stop) {
    const std::int64_t hk = p.kv_head(h);
    assign_rows(S, p.Lq, p.Lk, nullptr, stop);
    qrow.resize(static_cast<std::size_t>(p.Dk));
    for (std::int64_t i = 0; i < p.Lq; ++i) {
        stop.stop_if_requested();
        for (std::int64_t d = 0; d < p.Dk; ++d) qrow[static_cast<std::size_t>(d)] = load(p.q, p.q.offset(b, h, i, d));
        for (std::int64_t j = 0; j < p.Lk; ++j) {
            double dot = 0.0;
            for (std::int64_t d = 0; d < p.Dk; ++d) dot += qrow[static_cast<std::size_t>(d)] * load(p.k, p.k.offset(b, hk, j, d));
            S[static_cast<std::size_t>(i * p.Lk + j)] = dot * p.scale;
        }
    }
}

// Step 2 — modifiers and masks: the score rule every kernel applies (scores.hpp), here in
// double: softcap c·tanh(s/c), ALiBi −m_h·|d_b(i) − j|, add the additive bias, then set every position a mask forbids — the keep-mask, and the key
// interval of causal, window and key lengths — to −inf.
// (Setting it to 0 would still give it weight after the softmax; −inf gives none.)
// An additive −inf forbids too, by selection: a NaN or +inf score plus −inf is −inf, not
// NaN. A finite bias, however negative (−FLT_MAX), is added: a finite score.
void apply_masks(const SdpaProblem& p, std::int64_t b, std::int64_t h, std::vector<double>& S, const Interrupt& stop) {
    for (std::int64_t i = 0; i < p.Lq; ++i) {
        stop.stop_if_requested();
        apply_score_rule<double>(p, b, h, i, 0, p.Lk, S.data() + i * p.Lk, 1, p.key_range(b, i));
    }
}

// Step 3 — softmax by rows, shifted by the row max for stability. A row whose every
// score is −inf has no key to attend to: weights 0 and lse −inf (never 0/0 = NaN).
// With a sink σ (−inf = none) the row has one more logit with no value:
//   A_j = e^{s_j − m} / (e^{σ − m} + Σ_k e^{s_k − m}),  m = max(σ, max s),  lse includes σ;
// a row with no visible key then gives weights 0 and lse = σ.
void softmax_rows(std::int64_t rows, std::int64_t cols, const std::vector<double>& S, std::vector<double>& A,
                  std::vector<double>& lse, double sink, const Interrupt& stop) {
    assign_rows(A, rows, cols, nullptr, stop);
    lse.assign(static_cast<std::size_t>(rows), kNegInf);
    for (std::int64_t i = 0; i < rows; ++i) {
        stop.stop_if_requested();
        const double* s = S.data() + i * cols;
        double* a = A.data() + i * cols;
        double m = sink;
        bool any_nan = false;
        for (std::int64_t j = 0; j < cols; ++j) {
            any_nan |= std::isnan(s[j]);
            if (s[j] > m) m = s[j];
        }
        if (m == kNegInf && !any_nan) continue;  // fully masked row
        if (any_nan) m = std::numeric_limits<double>::quiet_NaN();  // NaN propagates as IEEE does
        double sum = sink == kNegInf ? 0.0 : std::exp(sink - m);
        for (std::int64_t j = 0; j < cols; ++j) {
            a[j] = std::exp(s[j] - m);
            sum += a[j];
        }
        for (std::int64_t j = 0; j < cols; ++j) a[j] /= sum;
        lse[static_cast<std::size_t>(i)] = m + std::log(sum);
    }
}

// Step 3b — dropout (training only; added with the backward pass): A ← A ∘ Z / (1 − p),
// Z[i][j] = the Philox keep decision of src/core/dropout.hpp. p = 0 leaves A untouched.
void apply_dropout(const SdpaProblem& p, std::int64_t b, std::int64_t h, std::vector<double>& A, const Interrupt& stop) {
    const Dropout drop = p.dropout();
    if (!drop.active) return;
    for (std::int64_t i = 0; i < p.Lq; ++i) {
        stop.stop_if_requested();
        for (std::int64_t j = 0; j < p.Lk; ++j) A[static_cast<std::size_t>(i * p.Lk + j)] *= drop.factor(b, h, i, j);
    }
}

// Step 4 — weighted sum of values: O[i] = Σ_j A[i][j]·V[j]
void weighted_sum(const SdpaProblem& p, std::int64_t b, std::int64_t h, const std::vector<double>& A,
                  std::vector<double>& O, const Interrupt& stop) {
    const std::int64_t hk = p.kv_head(h);
    O.assign(static_cast<std::size_t>(p.Lq * p.Dv), 0.0);
    for (std::int64_t i = 0; i < p.Lq; ++i) {
        stop.stop_if_requested();
        double* o = O.data() + i * p.Dv;
        for (std::int64_t j = 0; j < p.Lk; ++j) {
            const double a = A[static_cast<std::size_t>(i * p.Lk + j)];
            // A weight of exactly 0 (masked key, dropped, or empty row) selects: the key
            // contributes nothing even if V holds NaN/inf there (0·inf would be NaN).
            if (a == 0.0) continue;
            for (std::int64_t d = 0; d < p.Dv; ++d) o[d] += a * load(p.v, p.v.offset(b, hk, j, d));
        }
    }
}

}  // namespace

void reserve_head_steps(const SdpaProblem& p, HeadSteps& steps) {
    // Broadcast (stride-0) inputs make Lq·Lk as large as 2^66: said before any buffer is sized,
    // where the product would wrap (to 0 at 2^64, and the loops would write past an empty vector).
    const std::optional<std::int64_t> pairs = size_mul(p.Lq, p.Lk);
    if (!pairs || !size_mul(*pairs, 4 * static_cast<std::int64_t>(sizeof(double)))) reference_out_of_memory(p);
    reserving(p, [&] {
        for (std::vector<double>* v : {&steps.scores, &steps.softcapped_scores, &steps.masked_scores, &steps.weights})
            v->reserve(static_cast<std::size_t>(*pairs));
        steps.lse.reserve(static_cast<std::size_t>(p.Lq));
        steps.out.reserve(static_cast<std::size_t>(p.Lq * p.Dv));
        steps.q_row.reserve(static_cast<std::size_t>(p.Dk));
    });
}

void reference_head(const SdpaProblem& p, std::int64_t b, std::int64_t h, HeadSteps& steps, const Interrupt& stop) {
    if (steps.scores.capacity() == 0) reserve_head_steps(p, steps);  // the size check, once
    compute_scores(p, b, h, steps.scores, steps.q_row, stop);
    assign_rows(steps.softcapped_scores, p.Lq, p.Lk, steps.scores.data(), stop);
    if (p.softcap > 0.0)
        for (std::int64_t i = 0; i < p.Lq; ++i) {
            stop.stop_if_requested();
            double* row = steps.softcapped_scores.data() + i * p.Lk;
            for (std::int64_t j = 0; j < p.Lk; ++j) row[j] = softcap_value<double>(row[j], p.softcap, 1.0 / p.softcap);
        }
    assign_rows(steps.masked_scores, p.Lq, p.Lk, steps.scores.data(), stop);
    apply_masks(p, b, h, steps.masked_scores, stop);
    softmax_rows(p.Lq, p.Lk, steps.masked_scores, steps.weights, steps.lse, static_cast<double>(p.sink(h)), stop);
    apply_dropout(p, b, h, steps.weights, stop);  // dropout: weights become the dropped, rescaled A
    weighted_sum(p, b, h, steps.weights, steps.out, stop);
}

void reference_out_of_memory(const SdpaProblem& p) {
    std::optional<std::int64_t> per_thread = size_mul(p.Lq, p.Lk);
    if (per_thread) per_thread = size_mul(*per_thread, 4 * static_cast<std::int64_t>(sizeof(double)));
    throw OutOfMemory("out of memory: the reference kernel keeps one head's Lq x Lk = " + std::to_string(p.Lq) + " x " +
                      std::to_string(p.Lk) + " scores four times in double, " +
                      (per_thread ? describe_bytes(*per_thread) : std::string("more than 2^63 bytes")) +
                      " per thread; the flash kernel (float32, float16 or bfloat16 inputs) needs none of it");
}

namespace {

// One (b, h): its steps (in the thread's reserved buffers), then its rows of out (lse, weights,
// scores when asked), with the flag read before each row as in the steps: the weights and scores
// are Lq x Lk, and writing the weights alone took 0.6-0.85 s at 8192 queries and keys in double
// (8.4 s into a fresh buffer, whose first touch this is; a loaded 2-vCPU machine).
void forward_head(const SdpaProblem& p, std::int64_t b, std::int64_t h, HeadSteps& s, const Interrupt& stop) {
    reference_head(p, b, h, s, stop);
    for (std::int64_t i = 0; i < p.Lq; ++i) {
        stop.stop_if_requested();
        for (std::int64_t d = 0; d < p.Dv; ++d)
            store(p.out, p.out.offset(b, h, i, d), s.out[static_cast<std::size_t>(i * p.Dv + d)]);
        if (p.lse) store(*p.lse, p.lse->offset(b, h, i), s.lse[static_cast<std::size_t>(i)]);
        if (p.weights)
            for (std::int64_t j = 0; j < p.Lk; ++j)
                store(*p.weights, p.weights->offset(b, h, i, j), s.weights[static_cast<std::size_t>(i * p.Lk + j)]);
        if (p.scores) {
            const std::vector<double>& S = p.scores_stage == ScoreStage::scaled       ? s.scores
                                           : p.scores_stage == ScoreStage::softcapped ? s.softcapped_scores
                                                                                      : s.masked_scores;
            for (std::int64_t j = 0; j < p.Lk; ++j)
                store(*p.scores, p.scores->offset(b, h, i, j), S[static_cast<std::size_t>(i * p.Lk + j)]);
        }
    }
}

}  // namespace

void reference_forward(const SdpaProblem& p) {
    // Every thread's buffers before any row is written: a head that could not allocate left
    // the heads other threads had finished written (an out-of-memory test found out half-written).
    const int threads = team_size(p.B * p.Hq);
    std::vector<HeadSteps> steps;
    resize_or_throw(steps, threads, "the reference kernel's list of per-thread buffers");
    for (HeadSteps& s : steps) reserve_head_steps(p, s);
    const Interrupt stop;  // the caller's flag, taken here on the calling thread (interrupt.hpp)
    parallel_for_may_throw(p.B * p.Hq, threads, [&](std::int64_t bh) {
        forward_head(p, bh / p.Hq, bh % p.Hq, steps[static_cast<std::size_t>(omp_get_thread_num())], stop);
    });
}

}  // namespace attn::detail
