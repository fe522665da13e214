// The fused, tiled ("flash") forward kernel: O = softmax(Q·Kᵀ·scale + mask)·V without
// ever storing the Lq × Lk score matrix. See flash_driver.hpp for the algorithm, the
// tile sizes and where the FLOPs go; docs/kernels.md for the overview.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../../core/cpu_features.hpp"
#include "../../core/dropout.hpp"
#include "../../sdpa/problem.hpp"

namespace attn::detail {

// Tile sizes. A query block (Mb queries, a multiple of the 16-query panel) is one task
// for one thread; it walks the visible keys in blocks of Nb.
struct FlashTiles {
    int Mb = 64;
    int Nb = 64;
};

// The tile sizes the dispatch uses for these head dims (measured in dev/flash_lab.cpp).
FlashTiles flash_default_tiles(std::int64_t Dk, std::int64_t Dv);

// Empty when the flash kernel supports the problem, else the reason it declines
// (e.g. "Q is float64: the flash kernel computes in float32").
std::string flash_decline_reason(const SdpaProblem& p);

// Runs the kernel with the given ISA (tests call both; the dispatch uses select_isa()).
// `threads` <= 0 means the OpenMP default (ATTN_NUM_THREADS, else OMP_NUM_THREADS, else
// all cores). Results do not depend on the thread count. Precondition:
// flash_decline_reason(p) is empty (the dispatch checks it).
void flash_forward(const SdpaProblem& p, Isa isa, int threads = 0, const FlashTiles* tiles = nullptr);

// The per-ISA entry points (flash_generic.cpp, flash_avx2.cpp). `drop` is built from
// p.dropout_p / p.dropout_seed by flash_forward (outside the ISA files: its inline code
// must not be compiled with AVX2 flags).
void flash_forward_generic(const SdpaProblem& p, const FlashTiles& tiles, const Dropout& drop, int threads);
void flash_forward_avx2(const SdpaProblem& p, const FlashTiles& tiles, const Dropout& drop, int threads);

// The vectorised 2^x the kernels use, exposed so tests can measure its error:
// y[i] = 2^x[i]; 0 for x < −126 (no subnormals; softmax weights that small are 0 in
// float32 anyway), +inf for x >= 128, NaN stays NaN. Max relative error: see exp2.hpp.
void flash_exp2_generic(const float* x, float* y, std::size_t n);
void flash_exp2_avx2(const float* x, float* y, std::size_t n);  // only on a CPU with AVX2+FMA

}  // namespace attn::detail
