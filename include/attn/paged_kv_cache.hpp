// attn::PagedKVCache — K/V storage for a server: one pool of fixed-size pages shared by every
// sequence, a page table per sequence (vLLM's PagedAttention, FlashAttention's block_table).
// Sequences are added, grown, forked, truncated and freed independently; memory follows the
// tokens actually held, not B × the longest sequence.
//
//   pool:   keys (Hkv, num_pages, page_size, Dk), values (Hkv, num_pages, page_size, Dv),
//           storage float32, float16 or bfloat16; page_size a power of two (16, 32, ...).
//           Head-major, so that a sequence whose pages were handed out in order reads each
//           head's keys as one stream (pages are taken lowest-numbered first).
//   sequence s: positions 0 .. length(s)−1; position j is row j % page_size of page
//           page_table(s)[j / page_size]
//
// fork(s) makes a new sequence sharing all of s's pages (beam search, parallel sampling, a
// shared system prompt): nothing is copied then. A page is copied only when a sequence
// writes into a page it shares (copy-on-write: append into a shared, partly filled last
// page); a full shared page is never written, since appends go past it. So no sequence ever
// sees another's later tokens.
// Pool exhausted: append checks how many pages it needs (new pages + a copy-on-write copy)
// and throws attn::Error naming the sequence, the need and the free count before writing
// anything — nothing is overwritten, the cache is unchanged.
//
// Thread safety: none inside. Calls that change the cache (add_sequence, append, fork,
// truncate, free) need exclusive access; const calls (length, page_table, free_pages, ...,
// paged_attention) may run concurrently with each other, never with a changing call.
// A server loop runs attention for its batch, then appends — one thread, or a lock.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct PagedKVCacheConfig {
    std::int64_t kv_heads = 1;    // Hkv
    std::int64_t head_dim = 64;   // Dk
    std::int64_t value_dim = 0;   // Dv; 0 = head_dim
    std::int64_t page_size = 16;  // tokens per page, a power of two
    std::int64_t num_pages = 0;   // pages in the pool (>= 1), allocated up front
    DType storage = DType::f32;   // f32, f16 or bf16
};

class PagedKVCache {
public:
    using SeqId = std::int64_t;

    explicit PagedKVCache(const PagedKVCacheConfig& config);  // attn::Error on a bad config
    // A moved-from cache has no pages and no sequences: add_sequence, key_pages and value_pages
    // throw attn::Error, as does every call naming a sequence.
    PagedKVCache(PagedKVCache&&) noexcept;
    PagedKVCache& operator=(PagedKVCache&&) noexcept;
    ~PagedKVCache();

    // A new, empty sequence (no page yet). Ids of freed sequences are reused.
    SeqId add_sequence();
    // k_new (Hkv, T, Dk), v_new (Hkv, T, Dv), any float dtype and strides (rounded to the
    // storage type): appends T >= 0 tokens to sequence s.
    void append(SeqId s, const TensorView& k_new, const TensorView& v_new);
    // A new sequence holding s's tokens, sharing s's pages (copy-on-write).
    SeqId fork(SeqId s);
    // Sequence s keeps positions 0 .. new_length−1 (new_length <= length(s)); pages it no
    // longer needs return to the pool when no other sequence shares them.
    void truncate(SeqId s, std::int64_t new_length);
    // Ends sequence s: its pages return to the pool (unless shared); its id may be reused.
    void free(SeqId s);

    bool contains(SeqId s) const;
    std::int64_t length(SeqId s) const;
    // s's physical pages, in position order (ceil(length / page_size) of them). The reference
    // stays valid until s is freed (or the cache is moved from), whatever other sequences do;
    // s's own append and truncate change its contents.
    const std::vector<std::int32_t>& page_table(SeqId s) const;
    // Pages append(s, T tokens) would take from the pool (new pages + a copy-on-write copy).
    std::int64_t pages_needed(SeqId s, std::int64_t tokens) const;
    std::int64_t free_pages() const;
    std::int64_t num_pages() const { return config_.num_pages; }
    std::int64_t page_size() const { return config_.page_size; }
    std::int64_t kv_heads() const { return config_.kv_heads; }
    std::int64_t head_dim() const { return config_.head_dim; }
    std::int64_t value_dim() const { return config_.value_dim; }
    DType storage() const { return config_.storage; }
    std::int64_t pool_bytes() const;  // K and V pools together
    std::int64_t shared_pages() const;  // pages held by more than one sequence

    // The pools, (Hkv, num_pages, page_size, Dk) and (Hkv, num_pages, page_size, Dv).
    TensorView key_pages() const;
    TensorView value_pages() const;

private:
    struct Seq {
        bool live = false;
        std::int64_t length = 0;
        std::vector<std::int32_t> pages;
    };
    const Seq& seq(const char* op, SeqId s) const;
    std::int32_t take_page();
    void release_page(std::int32_t page);
    void become_empty() noexcept;                // the moved-from state
    void require_pool(const char* op) const;     // throws on a moved-from cache

    struct Pool;  // huge-page-advised storage (src/kv_cache/huge_buffer.hpp)
    PagedKVCacheConfig config_;
    std::unique_ptr<Pool> keys_, values_;
    std::vector<std::int32_t> refcount_;  // sequences holding each page
    std::vector<std::int32_t> free_list_;  // a min-heap of free page numbers
    // One allocation per sequence: page_table(s) returns a reference that must survive other
    // sequences' add_sequence/fork (a vector of Seq moved them all when it grew).
    std::vector<std::unique_ptr<Seq>> seqs_;
    std::vector<SeqId> free_ids_;
};

// Attention of Lq new queries per sequence against sequences of a PagedKVCache, reading the
// pages directly (no gather into a contiguous copy) with the decode kernel: split-KV over
// the pages, every query head sharing a KV head in one pass (GQA), float16/bfloat16 pages
// converted on the fly, for a decode step (a few rows per KV head: group·Lq below one flash
// panel, the dispatch's rule for every entry point). A longer query block (chunked prefill:
// the block's K/V appended first), or a panel's worth of rows per KV head, runs the flash
// kernel, its key tiles read through the page table (16-bit pages widened per tile); with
// impl = decode a block of more than 16 runs as blocks of 16 queries through the decode kernel
// instead, each reading the pages once.
//
//   q:    (B, Hq, Lq, Dk) float32, float16 or bfloat16 (the kernels' inputs; float64 is the
//         reference's, which does not read pages); batch row b is sequence seqs[b]; Hq a
//         multiple of Hkv
//   out:  (B, Hq, Lq, Dv) any float dtype (rounded once);  lse: (B, Hq, Lq) float32, optional
//   options: decode_attention's (scale, causal — bottom-right per sequence —, window,
//            query_offset, masks broadcastable to (B, Hq, Lq, max length), modifiers);
//            key_lengths come from the cache. impl must be auto, decode or flash. impl =
//            decode on what the decode kernel declines (dropout) is an error; auto runs flash.
// The result is bit-identical to decode_attention on a contiguous KVCache holding the same
// tokens (float32 or the same 16-bit storage) with impl auto (both make the same choice of
// decode or flash) or flash. impl = decode on a chunk (decode blocks) gives other
// float32 sums than decode_attention's flash, within the same bound against the reference.
void paged_attention(const TensorView& q, const PagedKVCache& cache, const std::vector<PagedKVCache::SeqId>& seqs,
                     const SdpaOptions& options, const TensorView& out, const TensorView* lse = nullptr);

}  // namespace attn
