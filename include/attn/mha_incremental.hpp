// Incremental (KV-cached) self-attention through a MultiHeadAttention layer
// (MultiHeadAttention::forward_incremental): a decoder feeds its tokens a few at a time, and
// the keys/values of earlier tokens come from an attn::KVCache instead of being projected
// again.
//
//   x_new (T, B, E), or (B, T, E) with batch_first, or unbatched (T, E) (cache batch 1)
//   [Q K V] = x_new · [W_Q; W_K; W_V]ᵀ + b            one fused GEMM, as forward() does
//   cache.append(K, V)                                  sequence b: n_b → n_b + T
//   O = attention(Q, cache), causal bottom-right per sequence: new token t of sequence b
//       (position n_b_old + t) sees cache positions 0 .. n_b_old + t — one call for all
//       sequences (key_lengths = the cache's lengths, docs/conventions.md):
//       decode_attention (the decode kernel for a few rows per KV head — group·T below one
//       flash panel, two with float32 K/V, docs/kernels.md "Decode or flash" — else flash; a
//       prefill block on 16-bit storage reads float32 copies of the filled rows)
//   output = O · W_Oᵀ + b_O                             shaped like x_new, float32
//
// Feeding a sequence in any split equals forward(x, x, x) with causal top_left over the whole
// sequence, up to rounding (and the storage type's rounding of K and V); a chunk of T tokens
// after n cached ones is forward(chunk, sequence, sequence) with causal bottom_right (Lq = T,
// Lk = n + T: MhaForwardOptions::causal).
// Requirements (attn::Error otherwise, before the cache or the output is written):
// self-attention weights (kdim == vdim == E), no add_bias_kv / add_zero_attn, and a cache
// with batch B, kv_heads = the layer's K/V heads, head_dim = value_dim = E / num_heads.
// A failure after the append (out of memory in attention or the projections) truncates the
// cache back to its old lengths: the same tokens and contents, but a cache that grew for the
// append keeps its larger capacity (the old buffers are gone by then).
#pragma once

#include "attn/error.hpp"
#include "attn/kv_cache.hpp"  // forward_incremental takes a KVCache
#include "attn/mha.hpp"
#include "attn/tensor.hpp"

// The entry points are members of attn::MultiHeadAttention (attn/mha.hpp):
//   Tensor layer.forward_incremental(x_new, cache, workspace = nullptr)
//   void   layer.forward_incremental_into(x_new, cache, output, workspace = nullptr)
// This header documents them and brings in KVCache beside the layer.
