// How the flash backward reads its operands (flash_backward.cpp): Q, dO, K and V rows as
// float32 — in place when the caller's memory already is that, else widened one (b, head) or
// one key block at a time, never a whole-tensor copy — the zeroed copies that the products
// dSᵀ·Q and P̂ᵀ·dO take for a head holding a NaN/±inf (flash_backward.cpp says why), and
// bf16 compute's rows and row pairs (tile.hpp, TileBf16).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::detail {

// Rows of a (B, H, L, D) tensor read in place as float32 rows of padded width Dp: only
// when the caller's memory already is that (float32, unit inner stride, D % 8 == 0).
// Anything else (16-bit, strided, odd D) is widened one (b, head) at a time inside
// the task that reads it (widen_rows).
struct Rows {
    const float* base = nullptr;
    std::int64_t sb = 0, sh = 0, si = 0;
    const float* row(std::int64_t b, std::int64_t h, std::int64_t i) const { return base + b * sb + h * sh + i * si; }
};

// t: (B, H, L, D) → true and `r` pointing at the caller's rows when they can be read in place.
bool direct_rows(const TensorView& t, int Dp, Rows& r);

// dst (L rows of width Dp, row stride Dp) = the rows of src (row stride ld) with every
// NaN/±inf entry 0: the operand of dSᵀ·Q or P̂ᵀ·dO for a head that holds one.
void finite_rows(const float* src, std::ptrdiff_t ld, std::int64_t L, int Dp, float* dst);

// The L rows of (b, h) widened to float32 into dst (row stride Dp; the padding columns D..Dp
// stay as the caller zeroed them).
void widen_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t L, int Dp, float* dst);

// dst[d·ldd + j] = src[j·ld + d] for j < n, d < D: a key block's float32 K or V rows (unit
// inner stride, in place) as Kᵀ or Vᵀ. Once per key block, read by all the block's tiles; the
// element-at-a-time scatter it replaced held ≈ 1.3 % of S1's backward (docs/kernels-lab.md#bwd-6).
void transpose_rows(const float* src, std::ptrdiff_t ld, int n, std::int64_t D, float* dst, std::ptrdiff_t ldd);

// dst rows (n of them, ld_dst floats apart) = src rows (ld_src apart) · f, cols floats each, by
// non-temporal stores (SSE2, the x86-64 baseline): dK/dV's first and only writes, which ordinary
// stores took with a read of each line first (docs/kernels-lab.md#bwd-11). Only whole 64-byte
// lines: false, nothing written, unless dst, ld_dst and cols are multiples of 16 floats (the
// caller then stores by store_row). The same values as store_row's float32 rows (src·f).
// Weakly ordered: the writer calls end_streams() before anything else may read the rows.
bool stream_rows(float* dst, std::ptrdiff_t ld_dst, const float* src, std::ptrdiff_t ld_src, int n, std::int64_t cols,
                 float f);
// A store fence: every stream_rows store before it reaches memory before any store after it.
void end_streams();

// Row (b, h, i) of t as float32: in place when t is float32 with unit inner stride, else
// widened into w (the same values: widening is exact).
const float* f32_row(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i, float* w);

// ── bf16 compute ───────────────────────────────────────────────────────────────────────
// Operands packed from float32 rows that hold bf16 values (the inputs are bf16, so
// attn/half.hpp's rounding is exact here); once per task (Q, dO) or key block (K, V), so this
// scalar packing costs ~1/Lq of the tile work.
// dst rows (n of them, ld_dst elements apart) = bf16 of src's first `cols` columns.
void bf16_rows(const float* src, std::ptrdiff_t ld, std::int64_t n, int cols, std::uint16_t* dst, std::ptrdiff_t ld_dst);
// dst[p][c] = (bf16 src[2p][c], bf16 src[2p+1][c]) for p < ⌈n/2⌉; the row past an odd n is 0.
void bf16_pairs(const float* src, std::ptrdiff_t ld, std::int64_t n, int cols, std::uint32_t* dst, std::ptrdiff_t ld_dst);

// Reading bfloat16 inputs as they are (no float32 round trip): the inputs already are the
// bf16 operands, so these only move 16-bit words; float_to_bf16 of a widened bf16 value is
// the value itself, NaN aside (it sets the quiet bit), so they give the bits
// bf16_rows/bf16_pairs give. On S1 the float32 route (widen, then round each element back by
// scalar code) cost more per task than 16 key blocks amortise.
// (bf16, unit inner stride, D == Dp, even row stride): its rows serve as TileBf16's q/dO rows in place.
bool bf16_rows_in_place(const TensorView& t, int Dp);
// dst[p][c] = (src[2p][c], src[2p+1][c]) for p < ⌈n/2⌉ of bf16 rows (unit inner stride,
// cols entries; the row past an odd n is 0): bf16_pairs of rows with no NaN/±inf.
void bf16_pairs16(const std::uint16_t* src, std::ptrdiff_t ld, std::int64_t n, int cols, std::uint32_t* dst,
                  std::ptrdiff_t ld_dst);
// Pairs along d of `n` bf16 rows of width D (element (j, d) at src[j·sj + d·sd]), one column
// per row: dst[p][j] = (x[j][2p], x[j][2p+1]) for p < ⌈D/2⌉, j < n; columns n..np are 0.
// What bf16_pairs makes of Kᵀ/Vᵀ.
void bf16_pairs_t16(const std::uint16_t* src, std::ptrdiff_t sj, std::ptrdiff_t sd, int n, int np, std::int64_t D,
                    std::uint32_t* dst, std::ptrdiff_t ld_dst);
// Pairs along the n keys of bf16 rows with NaN/±inf entries 0 (K for dS·K): dst[p][d] =
// (x[2p][d], x[2p+1][d]) for d < D, 0 for D ≤ d < Dp; the row past an odd n is 0.
void bf16_pairs_z16(const std::uint16_t* src, std::ptrdiff_t sj, std::ptrdiff_t sd, int n, std::int64_t D, int Dp,
                    std::uint32_t* dst, std::ptrdiff_t ld_dst);

}  // namespace attn::detail
