// The compute of one (query block × key block) tile of the tiled backward, for one ISA.
// The driver (flash_backward.cpp, portable code) packs operands, resolves masks and
// dropout into per-tile arrays and calls tile(); only tile() differs per ISA, so it is
// the only code compiled with ISA flags.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn::detail {

// Sizes in elements; "padded" widths are multiples of 8 with zero padding, so the
// GEMMs never need column edges. All float32.
struct TileArgs {
    int br = 0;   // query rows in the tile
    int bc = 0;   // keys in the tile
    int bcp = 0;  // bc rounded up to 8: the row stride of S, dP, Pd, bias, drop, kt, vt
    int Dk = 0, Dv = 0, Dkp = 0, Dvp = 0;
    const float* q = nullptr;   // (br, Dkp) row stride ldq: Q rows of the block
    std::ptrdiff_t ldq = 0;
    const float* dO = nullptr;  // (br, Dvp) row stride ldo: dO rows of the block
    std::ptrdiff_t ldo = 0;
    const float* kt = nullptr;  // (Dk, bcp): Kᵀ of the key block
    const float* vt = nullptr;  // (Dv, bcp): Vᵀ of the key block
    const float* kp = nullptr;  // (bc, Dkp): K of the key block
    const float* neg_lse = nullptr;  // (br): −lseᵢ; −inf for a row with no visible key
    const float* Drow = nullptr;     // (br): Dᵢ = rowsum(dO ∘ O)
    const float* bias = nullptr;  // (br, bcp) or null: additive mask, −inf where masked
    const float* drop = nullptr;  // (br, bcp) or null: dropout factor, 0 or 1/(1−p)
    float scale = 1.0f;
    float* S = nullptr;   // scratch (br, bcp): S, then P
    float* dP = nullptr;  // scratch (br, bcp): dP, then dS
    float* Pd = nullptr;  // scratch (br, bcp): P ∘ drop (used only with dropout)
    float* dq = nullptr;  // (br, Dkp) row stride lddq: dQ accumulator rows of the block
    std::ptrdiff_t lddq = 0;
    float* dk = nullptr;  // (bc, Dkp): dK accumulator of the key block
    float* dv = nullptr;  // (bc, Dvp): dV accumulator of the key block
};

using TileFn = void (*)(const TileArgs&);

void backward_tile_portable(const TileArgs& t);
void backward_tile_avx2(const TileArgs& t);  // only call when the CPU has AVX2 and FMA

// Dropout factors of 4·n4 consecutive keys 4·j4..4·j4+4·n4−1 of row (b, h, i):
// out[k] = keep ? scale : 0, with keep as defined in src/core/dropout.hpp (Philox4x32-10,
// counter (j4 + t, i, h, b), key = seed words, keep iff word >= threshold).
struct DropoutRowArgs {
    std::uint32_t key0, key1, threshold;
    float scale;
    std::uint32_t b, h, i, j4;
    int n4;
    float* out;
};
using DropoutRowFn = void (*)(const DropoutRowArgs&);
void dropout_row_portable(const DropoutRowArgs& a);
void dropout_row_avx2(const DropoutRowArgs& a);  // 8 Philox counters per AVX2 vector

}  // namespace attn::detail
