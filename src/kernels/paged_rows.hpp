// Paged K/V rows (PagedKVCache, src/kv_cache/paged_kv_cache.cpp), as the kernels that read
// pages in place see them: the decode kernel (decode/decode_core.hpp for_key_runs) and the
// flash driver (flash/flash_operands.hpp paged_tile_rows, chunked prefill). Plain data: it
// crosses into the ISA translation units, which compute the addresses themselves.
#pragma once

#include <cstdint>

namespace attn::detail {

// Key row j of sequence b is row j % page_size of page table[b·table_stride + j / page_size];
// the problem's K/V views then start at the pools (k/v.data()) with the head and row strides
// inside a page (stride(1), stride(2)), and a page is k_page_stride / v_page_stride elements.
struct PagedRows {
    const std::int32_t* table = nullptr;
    std::int64_t table_stride = 0;
    std::int64_t page_size = 0;  // a power of two
    int page_shift = 0;          // log2(page_size)
    std::int64_t k_page_stride = 0, v_page_stride = 0;
};

}  // namespace attn::detail
