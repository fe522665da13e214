// attn::decode_attention — attention of Lq new queries per sequence against everything in a
// KVCache. For a generation step (a few rows per KV head: group·Lq below one flash panel with
// 16-bit K/V, two with float32 — the dispatch's rule) it runs the decode kernel, whose cost is
// reading the cache (memory bandwidth, not FLOPs), so it reads each K and V byte once:
//   * GQA/MQA: every query head that shares a KV head is computed in the same pass;
//   * split-KV: when B·Hkv is small, each sequence's keys are split into chunks processed
//     in parallel and merged by their log-sum-exp (flash-decoding);
//   * float16 / bfloat16 storage is converted on the fly (F16C) and accumulated in fp32.
//
// The call is attn::sdpa's problem with K and V the cache's rows and key_lengths the
// cache's lengths, so every sdpa option means what it means there. With
// causal = bottom_right, new query i of sequence b (length n_b) sees cache positions
// 0 .. n_b − Lq + i — the rule of docs/conventions.md, per sequence:
//
//        cache positions →   0 1 2 3 4 5 6      (n_b = 7, Lq = 3)
//        query 0             x x x x x . .
//        query 1             x x x x x x .
//        query 2             x x x x x x x
//
//   q:   (B, Hq, Lq, Dk) float32, float64, float16 or bfloat16, any strides; Hq a multiple
//        of cache.kv_heads()
//   out: (B, Hq, Lq, Dv) any of the four float dtypes, rounded once from the float32 result
//   lse: (B, Hq, Lq) float32, optional: natural log-sum-exp of the scaled scores
//   options: scale, causal, window, query_offset, masks ((B, Hq, Lq, n) broadcastable,
//            n = max(1, cache.max_length()): 1 while every sequence is empty); key_lengths come from the cache (must be unset);
//            dropout as in sdpa (the decode kernel declines it: flash or the reference runs).
//            window.align is Window's default, top_left, as in sdpa: a decode step's window
//            usually wants Align::bottom_right (at each sequence's last key), which Python's
//            decode_attention and paged_attention take by default.
// Append the new tokens' K and V to the cache before calling: with causal masking (and no
// query_offset), a sequence holding 1 .. Lq − 1 positions is an error. An empty sequence (an
// idle slot of a batch) is not: its rows see no key (out 0, lse −inf), as in sdpa. Results do
// not depend on the thread count.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Throws attn::Error (naming the argument) before writing anything.
void decode_attention(const TensorView& q, const KVCache& cache, const SdpaOptions& options,
                      const TensorView& out, const TensorView* lse = nullptr);

// Largest Lq the decode kernel takes; larger query blocks are prefill (sdpa's flash kernel).
inline constexpr std::int64_t kMaxDecodeQueries = 16;

}  // namespace attn
