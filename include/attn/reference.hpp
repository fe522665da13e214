// The textbook path with every intermediate kept, for teaching and debugging:
// S = Q·Kᵀ·scale, the softcapped S, the masked S, A = softmax(masked S), O = A·V — all
// float64 (the stages of docs/conventions.md "Score modifiers").
// Memory is O(B·Hq·Lq·Lk): meant for small inputs, not for production lengths.
#pragma once

#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct AttentionSteps {
    Tensor scores;             // (B, Hq, Lq, Lk)  S = Q·Kᵀ·scale               ("scaled")
    Tensor softcapped_scores;  // (B, Hq, Lq, Lk)  c·tanh(S/c); = S without softcap ("softcapped")
    Tensor masked_scores;      // (B, Hq, Lq, Lk)  after softcap, ALiBi, + additive mask; masked = −inf ("masked")
    Tensor weights;        // (B, Hq, Lq, Lk)  A (with options.dropout_p > 0: A ∘ Z / (1 − p), what multiplies V)
    Tensor lse;            // (B, Hq, Lq)
    Tensor out;            // (B, Hq, Lq, Dv)  O
};

// Same arguments and checks as attn::sdpa (options.impl is ignored).
AttentionSteps reference_steps(const TensorView& q, const TensorView& k, const TensorView& v,
                               const SdpaOptions& options);

}  // namespace attn
