// Backward kernels of attention. Both receive a validated BackwardProblem.
#pragma once

#include "../isa.hpp"
#include "../../sdpa/problem.hpp"

namespace attn::detail {

struct BackwardProblem {
    SdpaProblem fwd;  // q, k, v, out, lse (always present), masks, scale, dropout
    TensorView grad_out;          // (B, Hq, Lq, Dv)
    TensorView dq, dk, dv;        // like q, k, v
    std::optional<TensorView> dsinks;  // (Hq,), only with fwd.sinks: ∂loss/∂σ_h
};

// Textbook gradient in double, the oracle: recomputes A, then
//   dV = Âᵀ·dO, dÂ = dO·Vᵀ, dA = dÂ∘Z/(1−p), dS = A∘(dA − rowsum(A∘dA)),
//   dQ = scale·dS·K, dK = scale·dSᵀ·Q   (Â = A∘Z/(1−p), the dropped weights).
// Softcap: dS ∘= 1 − tanh²(s/c) (s the scaled score). Sinks: the sink is a softmax entry
// with dA = 0, so ∂loss/∂σ_h = P_sink·(0 − rowsum(A∘dA)) summed over rows:
//   dσ_h = −Σ_{b,i} e^{σ_h − lse_{b,h,i}}·D_{b,h,i},   D = rowsum(A∘dA) = rowsum(dO∘O).
// O(Lq·Lk) memory per (b, h); threads over KV heads (deterministic).
void reference_backward(const BackwardProblem& p);

// "" when flash_backward can run these inputs, else why not: q, k, v, out, grad_out float32,
// float16 or bfloat16 (widened per tile) and a float32 lse, head dims within kMaxFastHeadDim
// (dispatch.hpp). The gradients may be any float dtype.
std::string flash_backward_declines(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse, const TensorView& grad_out);

// Compute::bf16_dot when flash_backward on `row` runs its products on bf16 pairs (KernelSet::backward_tile_bf16,
// docs/conventions.md "bf16 compute"): the row has them, and the forward's rule (Q, K, V and O
// bfloat16: SdpaProblem::bf16_products) holds with dO and the three gradients bfloat16 too — a
// float32 gradient asks for float32 accuracy — on a CPU with AVX-512 BF16. The one statement of
// the rule: the tile's choice and the report's kernel name ask it. Compute::bf16_amx instead when
// the row also has the AMX tile (KernelSet::backward_tile_amx) and the CPU AMX-BF16: the same
// operands, products on tiles. Else Compute::f32.
Compute backward_compute(const KernelSet& row, const BackwardProblem& p);

// How many chunks flash_backward splits each (b, KV head)'s key_blocks into, for bh = B·Hkv
// pairs, dQ partials of dq_part_floats each and a task target (split_target(8): at least 8, and
// four per CPU of the machine): enough chunks for bh·chunks >= target, but past 8 tasks only while
// the partials (chunks · dq_part_floats) stay within 256 MiB; between 1 and key_blocks.
std::int64_t backward_chunks(std::int64_t bh, std::int64_t key_blocks, std::int64_t dq_part_floats, std::int64_t target);

// Tiled fp32 backward (FlashAttention-2 style) from the saved lse; reads what
// flash_backward_reads accepts. `kernels` is a row of the kernel table (the dispatch passes
// kernel_set(); tests pass each row the CPU can run).
void flash_backward(const BackwardProblem& p, const KernelSet& kernels);

}  // namespace attn::detail
