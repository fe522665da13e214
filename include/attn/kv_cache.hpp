// attn::KVCache — the keys and values a decoder has already computed, kept so that each
// generation step only computes K and V for its new tokens (a decoder-only model lets each
// token see itself and earlier tokens, so earlier K and V never change).
//
//   keys:   (B, Hkv, capacity, Dk)   storage float32, float16 or bfloat16
//   values: (B, Hkv, capacity, Dv)
//   lengths: sequence b holds positions 0 .. length(b)−1; sequences of one batch may
//            differ in length (prompts of different sizes, finished sequences).
//
//   position:  0   1   2   ...  length(b)−1 | length(b) ... capacity−1
//              [ written, read by attention ]  [ free: never read        ]
//
// append() writes new tokens at each sequence's own end; truncate() rolls a sequence back
// (rejected speculative tokens); reset() empties it. When an append does not fit, the
// cache grows (doubling, up to max_capacity) if growth is on, and otherwise throws
// attn::Error before writing anything — it never overwrites a position silently.
// Sizes: a capacity (or max_capacity, or a growth) whose keys or values would need more
// bytes than a 64-bit size can count is an attn::Error; one the system cannot allocate is
// attn::OutOfMemory naming the buffer and the bytes. Either way the cache is unchanged.
// Growing reallocates: views from keys()/values() taken before an append are then stale
// (the append itself may read its tokens from such views: a prefix copied between sequences).
// A token read from the free positions (at or past a length) reads what the append may be
// writing there: defined memory, unspecified values.
//
// Thread safety: none inside, as PagedKVCache's. Calls that change the cache (append,
// truncate, reset, reserve, an MHA forward_incremental, which appends) need exclusive access;
// const calls (lengths, keys(), values(), decode_attention) may run concurrently with each
// other, never with a changing call (decode reading lengths and rows an append is writing is a
// data race).
//
// decode_attention() runs the bandwidth-bound decode kernel for Lq new queries per
// sequence against the cache (see include/attn/decode.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct KVCacheConfig {
    std::int64_t batch = 1;      // B
    std::int64_t kv_heads = 1;   // Hkv
    std::int64_t head_dim = 64;  // Dk
    std::int64_t value_dim = 0;  // Dv; 0 = same as head_dim
    std::int64_t capacity = 0;   // positions per sequence allocated up front (>= 1)
    DType storage = DType::f32;  // f32, f16 or bf16
    bool grow = false;           // on overflow: grow (true) or throw (false)
    std::int64_t max_capacity = 0;  // growth limit; 0 = no limit
};

class KVCache {
public:
    explicit KVCache(const KVCacheConfig& config);  // throws attn::Error on a bad config
    // A moved-from cache is empty (batch() 0, capacity() 0) and every other call on it throws
    // attn::Error; assigning a cache to it makes it usable again.
    KVCache(KVCache&&) noexcept;
    KVCache& operator=(KVCache&&) noexcept;
    ~KVCache();

    // k_new: (B, Hkv, T, Dk), v_new: (B, Hkv, T, Dv), any float dtype and strides (values
    // are rounded to the storage type). Appends T tokens to every sequence.
    void append(const TensorView& k_new, const TensorView& v_new);
    // k_new: (Hkv, T, Dk), v_new: (Hkv, T, Dv): appends T tokens to sequence b only.
    void append(std::int64_t b, const TensorView& k_new, const TensorView& v_new);

    // Roll sequence b (or all) back to new_length <= length(b). Positions beyond are free.
    void truncate(std::int64_t b, std::int64_t new_length);
    void truncate_all(std::int64_t new_length);  // every sequence to min(length, new_length)
    void reset();                  // every sequence to length 0; keeps the memory
    void reset(std::int64_t b);    // one sequence to length 0

    // Throws the attn::Error append(k_new, v_new) would throw for `tokens` more tokens in every
    // sequence (they do not fit and growth is off, or past max_capacity); changes nothing. For a
    // caller with work to do before its append (an MHA forward_incremental's projection).
    void require_room(std::int64_t tokens) const;

    // Make room for `capacity` positions per sequence (grows even when growth is off).
    void reserve(std::int64_t capacity);

    std::int64_t batch() const { return config_.batch; }
    std::int64_t kv_heads() const { return config_.kv_heads; }
    std::int64_t head_dim() const { return config_.head_dim; }
    std::int64_t value_dim() const { return config_.value_dim; }
    std::int64_t capacity() const { return capacity_; }
    DType storage() const { return config_.storage; }
    std::int64_t length(std::int64_t b) const;
    const std::vector<std::int64_t>& lengths() const { return lengths_; }
    std::int64_t max_length() const;

    // Views of the whole storage, (B, Hkv, capacity, Dk) and (B, Hkv, capacity, Dv).
    // Positions at or beyond length(b) hold stale or uninitialised data.
    TensorView keys() const;
    TensorView values() const;

private:
    struct Buffer;
    // The keys and values buffers a growth replaced (null when nothing grew). An append keeps
    // them until its rows are written: its tokens may be views of this cache's own storage.
    using Retired = std::array<std::unique_ptr<Buffer>, 2>;
    std::array<std::int64_t, 2> storage_bytes(std::string_view arg, std::int64_t capacity) const;
    Retired grow_to(std::string_view arg, std::int64_t capacity);
    Retired grow_for(const char* op, std::int64_t need);
    std::int64_t grown_capacity(const char* op, std::int64_t need) const;
    std::int64_t room_for_all(const char* op, std::int64_t tokens) const;
    std::int64_t check_fits(const char* op, std::int64_t b, std::int64_t extra) const;
    void write_rows(std::int64_t b, const TensorView& k, const TensorView& v, std::int64_t kb_dim);
    void become_empty() noexcept;                    // the moved-from state
    void require_storage(const char* op) const;      // throws on a moved-from cache
    void require_sequence(const char* op, std::int64_t b) const;  // and b is a sequence of it

    KVCacheConfig config_;
    std::int64_t capacity_ = 0;
    std::vector<std::int64_t> lengths_;
    std::unique_ptr<Buffer> k_, v_;
};

}  // namespace attn
