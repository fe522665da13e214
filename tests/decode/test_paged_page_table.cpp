// PagedKVCache::page_table(s) returns a reference into the cache: it must stay valid while s
// lives, whatever other sequences do. A server builds its block tables from these references
// and then forks beams or admits requests; the sequences were kept in a std::vector, whose
// growth on add_sequence/fork moved every sequence and left the references dangling (a
// heap-use-after-free under AddressSanitizer, found by an exploratory C++ program).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attn/paged_kv_cache.hpp"
#include "attn/tensor.hpp"

namespace attn::test {
namespace {

using SeqId = PagedKVCache::SeqId;

// Appends `tokens` zero tokens to s (the values do not matter here, the page tables do).
void append_zeros(PagedKVCache& cache, SeqId s, std::int64_t tokens) {
    const Tensor k(DType::f32, {cache.kv_heads(), tokens, cache.head_dim()}, true);
    cache.append(s, k, k);
}

TEST(PagedKVCachePageTable, ReferenceSurvivesOtherSequencesComingAndGoing) {
    PagedKVCacheConfig cfg;
    cfg.page_size = 2;
    cfg.head_dim = 4;
    cfg.num_pages = 64;
    PagedKVCache cache(cfg);
    const SeqId s = cache.add_sequence();
    append_zeros(cache, s, 3);  // pages 0, 1
    const std::vector<std::int32_t>& table = cache.page_table(s);
    const std::vector<std::int32_t>* const address = &table;
    const std::vector<std::int32_t> expected = table;  // a copy, to compare the reference against

    // Enough new sequences that a vector of them reallocates several times.
    std::vector<SeqId> others;
    for (int i = 0; i < 40; ++i) others.push_back(i % 2 == 0 ? cache.fork(s) : cache.add_sequence());
    append_zeros(cache, others[1], 5);
    cache.free(others[3]);
    others[3] = cache.add_sequence();

    ASSERT_EQ(&cache.page_table(s), address) << "the sequence's page table moved: references to it dangle";
    EXPECT_EQ(table, expected);
    // It follows s's own appends (the vector's contents change; the reference stays valid).
    append_zeros(cache, s, 2);  // the forks share page 1: copy-on-write, then one new page
    ASSERT_EQ(&cache.page_table(s), address);
    EXPECT_EQ(table.size(), 3u);
    EXPECT_EQ(table[0], expected[0]);
    EXPECT_NE(table[1], expected[1]) << "copy-on-write gave s its own copy of the shared last page";
}

}  // namespace
}  // namespace attn::test
