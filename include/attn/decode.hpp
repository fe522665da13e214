// attn::decode_attention — one generation step: Lq = 1..16 new queries per sequence
// against everything in a KVCache. The step's cost is reading the cache (memory
// bandwidth, not FLOPs), so the kernel reads each K and V byte once:
//   * GQA/MQA: every query head that shares a KV head is computed in the same pass;
//   * split-KV: when B·Hkv is small, each sequence's keys are split into chunks processed
//     in parallel and merged by their log-sum-exp (flash-decoding);
//   * float16 / bfloat16 storage is converted on the fly (F16C) and accumulated in fp32.
//
// Causal alignment is bottom-right *per sequence*: the cache's new tokens are the last
// Lq positions of each sequence, so new query i of sequence b (length n_b) sees cache
// positions 0 .. n_b − Lq + i:
//
//        cache positions →   0 1 2 3 4 5 6      (n_b = 7, Lq = 3)
//        query 0             x x x x x . .
//        query 1             x x x x x x .
//        query 2             x x x x x x x
//
//   q:   (B, Hq, Lq, Dk) float32, any strides; Hq a multiple of cache.kv_heads()
//   out: (B, Hq, Lq, Dv) float32
//   lse: (B, Hq, Lq) float32, optional: natural log-sum-exp of the scaled scores
// Append the new tokens' K and V to the cache before calling. Results do not depend on
// the thread count.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/kv_cache.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct DecodeOptions {
    std::optional<double> scale;  // default 1/sqrt(Dk); must be finite
    bool causal = true;           // false: every query sees all n_b cached positions
    std::int64_t window_left = -1;  // >= 0: query i also sees at most this many keys before its diagonal
};

// Throws attn::Error (naming the argument) before writing anything.
void decode_attention(const TensorView& q, const KVCache& cache, const DecodeOptions& options,
                      const TensorView& out, const TensorView* lse = nullptr);

// Largest Lq the decode kernel takes; larger query blocks are prefill (sdpa's flash kernel).
inline constexpr std::int64_t kMaxDecodeQueries = 16;

}  // namespace attn
