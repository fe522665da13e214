// attn::sdpa_varlen — attention over variable-length sequences packed without padding
// (FlashAttention's flash_attn_varlen_func layout), forward and backward.
//
// N sequences are concatenated along the token axis:
//   q: (Tq, Hq,  Dk)   rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]−1 are sequence b's queries
//   k: (Tk, Hkv, Dk)   rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]−1 are sequence b's keys
//   v: (Tk, Hkv, Dv)
//   q, k, v: float32, float64, float16 or bfloat16 (as in sdpa, any mix)
//   out: (Tq, Hq, Dv)  float32, float64, float16 or bfloat16, written completely (16-bit: rounded once)
//   lse: (Tq, Hq)      optional (an (Hq, Tq) buffer, FlashAttention's layout, is lse.transpose(0, 1))
//   cu_seqlens_q, cu_seqlens_k: (N+1,) int32/int64, cu[0] = 0, non-decreasing,
//                      cu_seqlens_q[N] = Tq, cu_seqlens_k[N] = Tk.  Any strides everywhere.
//
// Sequence b is exactly attn::sdpa on its own (1, Hq, Lq_b, Dk) × (1, Hkv, Lk_b, Dk) slice
// with the same SdpaOptions — scale, causal (top-left, or bottom-right = each sequence's own
// Lk_b − Lq_b), window, query_offset (one number, or (N,) per sequence), GQA, impl — so it is
// also the same as a batch padded to the longest sequence with key_lengths = Lk_b.
// Score modifiers: softcap and sinks (Hq,) apply to every sequence; alibi_slopes are (Hq,)
// for every sequence or (N, Hq), row b for sequence b.
// Not accepted (they have no packed meaning): bool_mask, additive_mask (broadcast to a ragged
// shape), key_lengths (cu_seqlens_k gives every sequence's keys) and a dropout_origin other
// than (0, 0, 0, 0) (each sequence draws from a seed of its own: Dropout below).
// A sequence with Lq_b = 0 writes nothing; one with Lk_b = 0 < Lq_b sees no key: out 0, lse −inf
// (σ_h with sinks: the sink is the row's only logit).
// Dropout: sequence b uses the Philox stream of seed varlen_dropout_seed(dropout_seed, b)
// at batch index 0 (so it differs from a padded batch's stream, where b is in the counter).
//
// Every argument, and all of cu_seqlens, is checked before anything is written (attn::Error
// naming the argument, the expectation and what was given).
#pragma once

#include <cstdint>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"

namespace attn {

// sdpa_varlen's output shapes, out (Tq, Hq, Dv) and lse (Tq, Hq), after its checks of q, k and v
// alone (as sdpa_output_shapes: for callers that allocate the outputs from the inputs).
struct SdpaVarlenShapes {
    Shape out;
    Shape lse;
};
SdpaVarlenShapes sdpa_varlen_output_shapes(const TensorView& q, const TensorView& k, const TensorView& v);

void sdpa_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens_q,
                 const TensorView& cu_seqlens_k, const SdpaOptions& options, const TensorView& out,
                 const TensorView* lse = nullptr, SdpaReport* report = nullptr);

// Gradients of sdpa_varlen, per sequence exactly sdpa_backward (dK/dV sum over the query
// heads sharing a KV head within the sequence). out and lse are the forward's, in the packed
// layout (out may be float16/bfloat16 here, as in sdpa_backward); dq like q, dk like k, dv
// like v, each float32, float64, float16 or bfloat16. A sequence with Lq_b = 0 gets dK = dV = 0 for its
// keys; one with Lk_b = 0 gets dQ = 0. dsinks (Hq,) (only with options.sinks): the sum over
// the sequences of sdpa_backward's dsinks, in sequence order (a sequence without keys adds 0).
// out, lse and grad_out are inputs (broadcast views too), the gradients outputs: sdpa_backward's rule.
void sdpa_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const TensorView& out,
                          const TensorView& lse, const TensorView& grad_out, const SdpaOptions& options,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          SdpaReport* report = nullptr, const TensorView* dsinks = nullptr);

// sdpa_varlen and sdpa_varlen_backward copy long sequences' K/V (and, in the backward, Q/dO)
// into a head-major buffer on 2 MiB pages, at most 256 MiB of copies — the backward's buffer also
// holds its staged gradients, the size of dq, dk and dv, written there and copied into them once
// every sequence has run, so that a refused call writes none — and keep that buffer for the next
// call: allocating it afresh cost its page faults on every call (V1 in BENCHMARKS.md:
// ~160 ms of CPU time per call on 2 threads). It stays allocated after the call returns;
// release_varlen_scratch() frees it now (the next call allocates again). Safe to call at any
// time, also while other threads run sdpa_varlen (a running call keeps its buffer until it ends).
void release_varlen_scratch();
// Bytes of the kept buffer now (0 after release_varlen_scratch()).
std::int64_t varlen_scratch_bytes();

// The dropout seed of sequence b, written out so that another implementation can reproduce the
// mask: splitmix64's output for the state seed + b·φ (its state advances by φ before the mix),
//   z = seed + (b + 1)·0x9E3779B97F4A7C15                  (mod 2^64)
//   z = (z ^ (z >> 30))·0xBF58476D1CE4E5B9;  z = (z ^ (z >> 27))·0x94D049BB133111EB;  z ^ (z >> 31)
// e.g. varlen_dropout_seed(0, 0) = 0xE220A8397B1DCDAF, splitmix64's first output for seed 0.
std::uint64_t varlen_dropout_seed(std::uint64_t seed, std::int64_t b);

}  // namespace attn
