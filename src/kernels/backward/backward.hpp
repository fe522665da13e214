// Backward kernels of attention. Both receive a validated BackwardProblem.
#pragma once

#include "../../sdpa/problem.hpp"

namespace attn::detail {

struct BackwardProblem {
    SdpaProblem fwd;  // q, k, v, out, lse (always present), masks, scale, dropout
    TensorView grad_out;          // (B, Hq, Lq, Dv)
    TensorView dq, dk, dv;        // like q, k, v
};

// Textbook gradient in double, the oracle: recomputes A, then
//   dV = Âᵀ·dO, dÂ = dO·Vᵀ, dA = dÂ∘Z/(1−p), dS = A∘(dA − rowsum(A∘dA)),
//   dQ = scale·dS·K, dK = scale·dSᵀ·Q   (Â = A∘Z/(1−p), the dropped weights).
// O(Lq·Lk) memory per (b, h); threads over KV heads (deterministic).
void reference_backward(const BackwardProblem& p);

// Tiled fp32 backward (FlashAttention-2 style) from the saved lse; needs float32 q, k, v,
// out, grad_out, lse. Picks the AVX2+FMA path at run time when the CPU has it.
// Returns the name of the path that ran.
const char* flash_backward(const BackwardProblem& p);

// Which flash backward path this CPU runs ("avx2" or "portable").
bool flash_backward_has_avx2();

// Testing hook: run the portable tile even on an AVX2 CPU (not thread-safe; set it
// between calls).
void flash_backward_force_portable(bool on);

}  // namespace attn::detail
