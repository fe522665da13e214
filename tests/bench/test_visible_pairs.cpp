// bench/visible_pairs.hpp and sdpa_forward_flop: the pairs a causal mask leaves, counted by hand
// for square and non-square shapes of both alignments ("causal counts half" was right for none of
// them exactly, and far off where Lq ≠ Lk).
#include <gtest/gtest.h>

#include "harness.hpp"
#include "visible_pairs.hpp"

namespace attn::bench {
namespace {

TEST(VisiblePairs, WithoutAMaskEveryPair) {
    EXPECT_EQ(visible_pairs(2, 3, 5, 7, Causal::none), 2 * 3 * 5 * 7);
}

TEST(VisiblePairs, SquareCausalIsTheTriangleWithItsDiagonal) {
    // L = 4: rows see 1, 2, 3, 4 keys = 10 = L(L+1)/2, not L²/2 = 8; both alignments agree.
    EXPECT_EQ(visible_pairs(1, 1, 4, 4, Causal::top_left), 10);
    EXPECT_EQ(visible_pairs(1, 1, 4, 4, Causal::bottom_right), 10);
    EXPECT_EQ(visible_pairs(3, 2, 4, 4, Causal::top_left), 3 * 2 * 10);
}

TEST(VisiblePairs, FewerQueriesThanKeys) {
    // Lq = 3, Lk = 5 (docs/conventions.md's pictures): top-left rows see 1, 2, 3 keys; bottom-right
    // 3, 4, 5. "Half" said 7.5 for both.
    EXPECT_EQ(visible_pairs(1, 1, 3, 5, Causal::top_left), 6);
    EXPECT_EQ(visible_pairs(1, 1, 3, 5, Causal::bottom_right), 12);
}

TEST(VisiblePairs, MoreQueriesThanKeys) {
    // Lq = 5, Lk = 3: top-left rows see 1, 2, 3, 3, 3 keys; bottom-right (offset 3 − 5 = −2) 0, 0, 1, 2, 3.
    EXPECT_EQ(visible_pairs(1, 1, 5, 3, Causal::top_left), 12);
    EXPECT_EQ(visible_pairs(1, 1, 5, 3, Causal::bottom_right), 6);
}

TEST(VisiblePairs, ForwardFlopIsTwoDkPlusDvPerPair) {
    SdpaShape s;
    s.B = 2, s.Hq = 4, s.Hkv = 2, s.Lq = 3, s.Lk = 5, s.Dk = 16, s.Dv = 8;
    EXPECT_EQ(sdpa_forward_flop(s), 2.0 * (16 + 8) * 2 * 4 * 15);
    s.causal = Causal::bottom_right;
    EXPECT_EQ(sdpa_forward_flop(s), 2.0 * (16 + 8) * 2 * 4 * 12);
    s.causal = Causal::top_left;
    EXPECT_EQ(sdpa_forward_flop(s), 2.0 * (16 + 8) * 2 * 4 * 6);
}

}  // namespace
}  // namespace attn::bench
