// Head-major K/V for one long sequence of a packed batch (sdpa_varlen's forward).
//
// Packed K/V are (T, H, D): consecutive keys of one head are H·D floats apart (4 KiB at
// H = 16, D = 64). The flash kernel reads its key tiles in place, so a 64-key tile of such a
// view has every row at the same 4 KiB offset modulo the L1 way size: all 64 rows fall into
// the same few L1 sets and the tile does not stay in L1 while the query panels of the block
// walk it (measured on V1: the varlen rows ran about 14 % fewer FLOP/s per tile than the same
// kernel on a padded head-major batch). Copying the sequence's K and V once into a
// head-major (1, H, L, D) buffer costs O(L·H·D) against the attention's O(Lq·Lk·H·D), and the
// kernels read the same values, so the result is bit-identical.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {

// Reused scratch for head_major_kv, sized once (reserve) for the largest sequence.
struct HeadMajorScratch {
    Tensor buf;
    // Room for p's K and V (call for every problem that will be copied, before the first copy).
    void reserve(const SdpaProblem& p);
    std::int64_t need = 0;
};

// True when copying p's K/V head-major is worth it: float32 K and V with a contiguous head
// dim but keys not adjacent (the packed layout), and enough queries and keys that every
// key tile is read by several query blocks.
bool head_major_pays(const SdpaProblem& p);

// p with K and V replaced by head-major copies in `scratch` (same shapes and values).
// The copy runs on attn::num_threads() threads.
SdpaProblem head_major_kv(const SdpaProblem& p, HeadMajorScratch& scratch);

}  // namespace attn::detail
