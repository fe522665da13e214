// One generation step of B = 2 sequences against 5000 keys each, on a contiguous KVCache and on a
// PagedKVCache holding the same keys: B·Hkv = 4 rows, so decode splits the keys (split-KV), and
// the paged cache reads them across pages. The thread tests' decode case (same bits on any
// thread count, the same bits from two callers at once).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "common/util.hpp"

namespace attn::test {

class DecodeOnCaches {
public:
    explicit DecodeOnCaches(std::uint64_t seed) : rng_(seed), q_(randn(DType::f32, Shape{kB, kHq, 1, kD}, rng_)) {
        for (std::int64_t b = 0; b < kB; ++b) seqs_.push_back(paged_.add_sequence());
        for (std::int64_t b = 0; b < kB; ++b) {
            const Tensor k = randn(DType::f32, Shape{kHkv, kL, kD}, rng_), v = randn(DType::f32, Shape{kHkv, kL, kD}, rng_);
            cache_.append(b, k, v);
            paged_.append(seqs_[static_cast<std::size_t>(b)], k, v);
        }
        opt_.causal = Causal::bottom_right;
    }

    // decode_attention's out and lse, then paged_attention's out. Const: it only reads the caches.
    std::vector<Tensor> operator()() const {
        std::vector<Tensor> all;
        all.emplace_back(DType::f32, Shape{kB, kHq, 1, kD});
        all.emplace_back(DType::f32, Shape{kB, kHq, 1});
        all.emplace_back(DType::f32, Shape{kB, kHq, 1, kD});
        const TensorView lse = all[1].view();
        decode_attention(q_, cache_, opt_, all[0], &lse);
        paged_attention(q_, paged_, seqs_, opt_, all[2]);
        return all;
    }

private:
    static constexpr std::int64_t kB = 2, kHq = 8, kHkv = 2, kL = 5000, kD = 64;
    std::mt19937_64 rng_;
    Tensor q_;
    KVCache cache_{KVCacheConfig{.batch = kB, .kv_heads = kHkv, .head_dim = kD, .capacity = kL}};
    PagedKVCache paged_{PagedKVCacheConfig{.kv_heads = kHkv, .head_dim = kD, .page_size = 16, .num_pages = 2 * kL / 16 + 2}};
    std::vector<PagedKVCache::SeqId> seqs_;
    SdpaOptions opt_;
};

}  // namespace attn::test
