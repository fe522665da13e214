// Incremental (KV-cached) self-attention through a MultiHeadAttention layer: a decoder
// feeds its tokens a few at a time, and the keys/values of earlier tokens come from an
// attn::KVCache instead of being projected again (earlier tokens never see later ones,
// so their K and V never change).
//
//   x_new (T, B, E), or (B, T, E) with batch_first, or unbatched (T, E) (cache batch 1)
//   [Q K V] = x_new · [W_Q; W_K; W_V]ᵀ + b            one fused GEMM, as forward() does
//   cache.append(K, V)                                  sequence b: n_b → n_b + T
//   O = attention(Q, cache), causal bottom-right per sequence: new token t of sequence b
//       (position n_b_old + t) sees cache positions 0 .. n_b_old + t
//       T <= kMaxDecodeQueries: decode_attention (reads 16-bit storage directly)
//       longer blocks (prefill):  attn::sdpa per sequence over its cache rows
//   output = O · W_Oᵀ + b_O                             shaped like x_new, float32
//
// Feeding a sequence in any split equals forward(x, x, x, is_causal = true) over the whole
// sequence, up to rounding (and the storage type's rounding of K and V).
// Requirements (attn::Error otherwise, before the cache or the output is written):
// self-attention weights (kdim == vdim == E), no add_bias_kv / add_zero_attn, and a cache
// with batch B, kv_heads = the layer's K/V heads, head_dim = value_dim = E / num_heads.
#pragma once

#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Returns the output (shaped like x_new); appends x_new's keys/values to the cache.
Tensor mha_forward_incremental(const MultiHeadAttention& layer, const TensorView& x_new, KVCache& cache,
                               MhaWorkspace* workspace = nullptr);

// The same into a caller-owned float32 contiguous output shaped like x_new.
void mha_forward_incremental_into(const MultiHeadAttention& layer, const TensorView& x_new, KVCache& cache,
                                  const TensorView& output, MhaWorkspace* workspace = nullptr);

}  // namespace attn
