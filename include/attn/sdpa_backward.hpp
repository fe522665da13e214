// attn::sdpa_backward — gradients of scaled dot-product attention (training).
//
// Given the forward's inputs and outputs and dO = ∂loss/∂O, computes
//   dQ = ∂loss/∂Q, dK = ∂loss/∂K, dV = ∂loss/∂V
// for O = dropout(softmax(Q·Kᵀ·scale + mask))·V with the same SdpaOptions as the forward
// (masks, causal alignment, window, key lengths, scale, dropout_p/dropout_seed).
//
//   q: (B, Hq, Lq, Dk)   k: (B, Hkv, Lk, Dk)   v: (B, Hkv, Lk, Dv)      any strides
//   out: (B, Hq, Lq, Dv) the forward's O         lse: (B, Hq, Lq) the forward's lse
//   grad_out: (B, Hq, Lq, Dv) dO
//   dq: like q, dk: like k, dv: like v           written completely
//   q, k, v, out, grad_out, dq, dk, dv: float32, float64, float16 or bfloat16, any mix (a
//   16-bit gradient is the float32 one rounded once); lse float32 or float64
//   (docs/conventions.md, "Backward with 16-bit tensors").
//   dsinks: (Hq,) float32/float64, optional, only with options.sinks: ∂loss/∂σ_h =
//           −Σ_{b,i} e^{σ_h − lse}·rowsum(dO ∘ O). Softcap is differentiated through
//           (dS ∘= 1 − tanh²(s/c)); ALiBi slopes get no gradient.
//
// The fast kernel (Impl::flash, chosen by auto unless an input or lse is float64; it widens
// 16-bit inputs to float32 as it packs them and sums in float32) never stores the
// Lq×Lk matrix: it recomputes P = exp(S − lse) tile by tile (FlashAttention-2's
// backward). With GQA, dK and dV sum over the query heads sharing a KV head. A row with
// no visible key contributes nothing (zero gradients, never NaN). The additive mask
// gets no gradient. Results are bit-identical across runs and thread counts.
// Impl::reference is the textbook gradient in double (it recomputes A from Q and K and
// ignores out and lse, which are still checked).
#pragma once

#include "attn/error.hpp"
#include "attn/sdpa.hpp"

namespace attn {

// Throws attn::Error (naming the argument, the expectation and what was given) before
// writing anything. dq, dk and dv must not overlap each other or any input, and each needs its
// own memory for every element; out, lse and grad_out are inputs like q (any strides, broadcast
// views too, and they may share memory with each other or with q, k, v).
// Out of memory is attn::OutOfMemory naming the buffer and its bytes. The buffers are sized
// before anything is written, except the flash kernel's copy of a head's q or grad_out rows
// that hold a NaN or ±inf (one per thread, sized by the first task that meets such a head):
// its refusal leaves dq, dk, dv and dsinks partially written (docs/errors.md).
void sdpa_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse, const TensorView& grad_out, const SdpaOptions& options,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv, SdpaReport* report = nullptr,
                   const TensorView* dsinks = nullptr);

}  // namespace attn
