// Some sequences of a PagedKVCache as the kernels that read pages see them (kernels/paged_rows.hpp):
// paged_attention's K/V and key lengths, in one place, so that a test that runs a kernel on the
// pages itself (with tiles of its own choice) runs it on the problem paged_attention makes.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/paged_kv_cache.hpp"
#include "attn/tensor.hpp"
#include "../kernels/paged_rows.hpp"

namespace attn::detail {

// Batch entry b is sequence seqs[b]. Precondition: every id is a sequence of the cache (the
// caller says which is not, in its own words). Neither copied nor moved: rows points into table.
struct PagedLayout {
    std::vector<std::int32_t> table;    // one row of `pages` entries per batch entry (unused: page 0, never read)
    std::vector<std::int64_t> lengths;  // (B,) each sequence's length
    PagedRows rows;                     // the tables, the page size and the pools' page strides
    // (B, Hkv, n, Dk) and (B, Hkv, n, Dv), n the longest length (at least 1), with the pools'
    // head stride and a page's row stride: rows are found through `rows`, never through the
    // batch dim (stride 0). The whole pools are the call's inputs, not only what these reach.
    TensorView k, v;
    TensorView key_lengths;  // lengths as an int64 (B,) view: the problem's key lengths

    PagedLayout(const PagedKVCache& cache, const std::vector<PagedKVCache::SeqId>& seqs);
    PagedLayout(const PagedLayout&) = delete;
    PagedLayout& operator=(const PagedLayout&) = delete;
};

}  // namespace attn::detail
