// Which sdpa calls one (query segment, key segment) block of the ring needs, and with which
// options, so that the blocks together give single-process attn::sdpa on global positions.
//
// The structural masks of the global problem (causal, window, key lengths; one alignment
// rule, SdpaProblem::diagonal_offset) leave sequence b a band of keys around each query:
//   query i sees key j  iff  0 <= j < n_b,  j − i >= lo_b (if bounded),  j − i <= hi_b (if bounded)
// A block holds global queries qs.start + a and keys ks.start + c, so in local indices the band
// is c − a ∈ [lo_b + s, hi_b + s] with s = qs.start − ks.start: one sdpa call with
// query_offset_b = hi_b + s and causal (the upper side), window.left = hi_b − lo_b (the lower
// side) and the block's key lengths. Rows and keys that no sequence sees are trimmed away; a
// block nobody sees gives no call. docs/ring.md draws it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "../sdpa/problem.hpp"
#include "attn/ring.hpp"

namespace attn::dist::detail {

// Sequence b's band on global positions (see above). Unbounded sides are nullopt.
struct Band {
    std::int64_t keys = 0;  // n_b
    std::optional<std::int64_t> lo, hi;
    std::optional<std::int64_t> alibi;  // with ALiBi: its diagonal, key − query = alibi (alibi_offset)
};

// The bands of every sequence, from the global problem's rule. `global` carries Lq, Lk,
// key_lengths, the query offset, causal and window of the whole sequence (no tensors).
// With `alibi`, each band also carries the ALiBi diagonal (SdpaProblem::alibi_offset).
std::vector<Band> global_bands(const attn::detail::SdpaProblem& global, bool alibi = false);

// One sdpa call of a block: batch [b0, b0 + nb), the segment's query rows [row0, row0 + rows),
// the key segment's keys [key0, key0 + keys).
struct BlockCall {
    std::int64_t b0 = 0, nb = 0, row0 = 0, rows = 0, key0 = 0, keys = 0;
    std::int64_t global_row0 = 0, global_key0 = 0;  // qs.start + row0, ks.start + key0 (dropout's origin)
    Causal causal = Causal::none;           // top_left with query_offset when the band has an upper side
    std::int64_t window_left = -1;          // the lower side, relative to the same diagonal
    std::int64_t window_right = -1;         // with ALiBi: the upper side (no causal), see below
    bool has_offset = false;
    std::vector<std::int64_t> offset;       // (nb,) query_offset per sequence
    bool has_key_lengths = false;
    std::vector<std::int64_t> key_lengths;  // (nb,) valid keys of the trimmed block
    std::int64_t visible = 0;               // visible (row, key) pairs summed over the nb sequences
    // With ALiBi, sdpa measures |d − j| from the call's query_offset, so the offset must be the
    // ALiBi diagonal A and the band becomes a window (left, right) around it. When A lies outside
    // the block's band, the offset is the band's nearest edge E instead: every visible key is on
    // one side of both, so each score is exactly m_h·|A − E| higher than the global one and the
    // block's lse too (its output is unchanged). alibi_shift[b] = |A − E| (0 when A is inside);
    // the caller subtracts m_h·alibi_shift from the block's lse (forward) or adds it to the
    // lse it passes (backward).
    std::vector<std::int64_t> alibi_shift;  // (nb,), only with ALiBi
};

// The calls for the block (query segment qs, key segment ks): none when no query sees a key,
// one in general, one per sequence when the band's width differs between sequences (a window
// and causal with different alignments under key lengths).
std::vector<BlockCall> plan_block(const std::vector<Band>& bands, const Segment& qs, const Segment& ks);

// The call cut into consecutive pieces of at most max_rows query rows (just the call when it has
// no more): each piece is the same band on its own rows — query offsets and the dropout origin
// move with the piece's first row; keys, key lengths, window and ALiBi shift stay — so the pieces
// compute exactly the call's rows. The ring computes a large block in pieces to call MPI_Testall
// between them: without an MPI progress thread a large message moves only inside MPI calls.
// `visible` (a count for RingStats) stays whole on the first piece.
std::vector<BlockCall> split_rows(const BlockCall& c, std::int64_t max_rows);

// Query rows per piece of a block call in the ring (split_rows): small enough that a step's
// compute pokes MPI often (≈ 8 times per call at 131072 tokens on 4 ranks), large enough that a
// piece's fixed costs (packing the keys, a thread team) stay well under 1 % of its work.
inline constexpr std::int64_t kPokeRows = 2048;

}  // namespace attn::dist::detail
