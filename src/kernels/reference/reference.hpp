// The textbook attention, in double: the oracle every fast kernel is tested against,
// and the path that can show the intermediates S (scores) and A (weights).
#pragma once

#include <new>
#include <stdexcept>
#include <vector>

#include "../../core/interrupt.hpp"
#include "../../sdpa/problem.hpp"

namespace attn::detail {

// One (batch, head) pair, written as the tutorials write it. Buffers are row-major
// Lq × Lk (scores, weights) and Lq × Dv (out), all double.
struct HeadSteps {
    std::vector<double> scores;         // S = Q·Kᵀ·scale
    std::vector<double> softcapped_scores;  // c·tanh(S / c) (= S without softcap)
    std::vector<double> masked_scores;  // the score rule: softcap, ALiBi, + additive mask, masked = −inf
    std::vector<double> weights;        // A = softmax(masked S) by rows; a row with no key: 0
                                        // (with dropout: A ∘ Z / (1 − p), what multiplies V)
    std::vector<double> lse;            // log(e^σ + Σ exp(masked S)) per row (σ = sink, −inf without);
                                        // −inf for a row with no key and no sink
    std::vector<double> out;            // O = A·V
    std::vector<double> q_row;          // scratch of step 1: one query row
};

// Reserves a HeadSteps' buffers for one head of p, so reference_head allocates nothing: the
// callers reserve one per thread before the first output is written, and an allocation the
// system refuses leaves every output as it was. attn::OutOfMemory (reference_out_of_memory)
// when the system refuses or Lq·Lk is past 2^63 bytes.
void reserve_head_steps(const SdpaProblem& p, HeadSteps& steps);

// One head: fills `steps` (which need not be reserved; reserved ones are not reallocated).
// Reads `stop` once per query row of each step: attn::Interrupted, `steps` unfinished, once set.
void reference_head(const SdpaProblem& p, std::int64_t b, std::int64_t h, HeadSteps& steps, const Interrupt& stop);

// All heads; writes p.out (and p.lse, p.weights when present). Threads over (b, h), each with
// buffers reserved before the first write (an allocation the system refuses is
// attn::OutOfMemory from reference_out_of_memory, every output as it was).
void reference_forward(const SdpaProblem& p);

// attn::OutOfMemory naming what the reference holds per thread: one head's Lq × Lk scores,
// four times in double (HeadSteps), and the way out (the float32 kernels need none of it).
[[noreturn]] void reference_out_of_memory(const SdpaProblem& p);

// Runs `reserve` (vector reserves for problem p), a refused allocation or a size above a
// std::vector's max_size() coming out as reference_out_of_memory(p).
template <class Reserve>
void reserving(const SdpaProblem& p, Reserve&& reserve) {
    try {
        reserve();
    } catch (const std::bad_alloc&) {
        reference_out_of_memory(p);
    } catch (const std::length_error&) {
        reference_out_of_memory(p);
    }
}

}  // namespace attn::detail
