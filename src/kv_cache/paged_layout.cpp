// PagedLayout: the page tables and K/V views of paged_attention's problem (paged_layout.hpp).
#include "paged_layout.hpp"

#include <algorithm>

#include "../core/allocate.hpp"

namespace attn::detail {

PagedLayout::PagedLayout(const PagedKVCache& cache, const std::vector<PagedKVCache::SeqId>& seqs) {
    const auto B = static_cast<std::int64_t>(seqs.size());
    resize_or_throw(lengths, B, "the lengths of seqs");
    std::int64_t n = 1, pages = 1;
    for (std::size_t b = 0; b < seqs.size(); ++b) {
        lengths[b] = cache.length(seqs[b]);
        n = std::max(n, lengths[b]);
        pages = std::max(pages, static_cast<std::int64_t>(cache.page_table(seqs[b]).size()));
    }
    resize_or_throw(table, B * pages, "the page tables of seqs");
    for (std::size_t b = 0; b < seqs.size(); ++b) {
        const std::vector<std::int32_t>& t = cache.page_table(seqs[b]);
        std::copy(t.begin(), t.end(), table.begin() + static_cast<std::ptrdiff_t>(b) * pages);
    }
    const std::int64_t ps = cache.page_size(), Hkv = cache.kv_heads(), Dk = cache.head_dim(), Dv = cache.value_dim();
    rows.table = table.data();
    rows.table_stride = pages;
    rows.page_size = ps;
    while ((std::int64_t{1} << rows.page_shift) < ps) ++rows.page_shift;
    rows.k_page_stride = ps * Dk;
    rows.v_page_stride = ps * Dv;
    const std::int64_t P = cache.num_pages();
    k = TensorView(cache.key_pages().data(), cache.storage(), Shape{B, Hkv, n, Dk}, Strides{0, P * ps * Dk, Dk, 1});
    v = TensorView(cache.value_pages().data(), cache.storage(), Shape{B, Hkv, n, Dv}, Strides{0, P * ps * Dv, Dv, 1});
    key_lengths = TensorView(lengths.data(), DType::i64, Shape{B});
}

}  // namespace attn::detail
