// The AMX-BF16 micro-kernels of the flash forward (flash_amx_bf16.cpp, compiled with
// ATTN_AMX_BF16_FLAGS): Sᵀ = K·Qᵀ and Oᵀ += Vᵀ·Pᵀ as tdpbf16ps on 16 × 16 float32 tiles, in
// the one tile configuration of simd/amx_tiles.hpp (every tmm 16 rows × 64 bytes).
//
// tdpbf16ps C[16 × 16 f32] += A[16 rows × 32 bf16] · B[16 pair rows × 16 pair words]: A's rows
// run along the reduction, B holds pairs along it — the pair words of bf16_dot.hpp. So:
//   Sᵀ = K·Qᵀ   reduces over d:    A = 16 K rows × 32 d (the bf16 rows as they are),
//                                  B = 16 rows of the packed Qᵀ pairs qt[d/2][32 queries]
//                                      (one 16-query half of a panel), C = 16 keys × 16 queries.
//   Oᵀ += Vᵀ·Pᵀ reduces over keys: A = 16 rows of Vᵀ × 32 keys (the V pair words transposed:
//                                      row d holds (V[2k][d], V[2k+1][d]) for k < 16; one
//                                      32-key unit's tiles lie together, pv_amx),
//                                  B = 16 rows of the softmax's Pᵀ pairs pp[j/2][query],
//                                  C = 16 head-dim rows × 16 queries of the Oᵀ accumulator.
// Both tile 2 × 2: two A and two B tiles feed four C tiles (8 tmm), so each loaded tile is
// used twice. Every operand past its real extent is zero in memory (scratch), never read past
// a tensor: a zero bf16 adds exactly 0 — and a pair row or column left unwritten could hold a
// NaN pattern, and 0·NaN is NaN.
//
// Only flash_avx512.cpp's AmxBf16Ops calls these, on a CPU with AMX-BF16 (flash.cpp checks
// cpu_features().has_amx_bf16(), which includes the OS's grant of the tile state). Rounding
// as vdpbf16ps: products of bf16 exact, float32 sums, bf16 denormals read as 0, denormal sums
// flushed to 0 (amx_tiles.hpp).
#pragma once

#include <cstdint>

namespace attn::detail::flash_amx_bf16_ns {

// Floats of the C staging buffer the two kernels take (cbuf): four 16 × 16 float32 tiles.
inline constexpr int kAmxStageFloats = 4 * 16 * 16;

// s[j][c] = c2 · Σ_d K[j][d]·Q[c][d]   for j < nk, c < 32·panels.
// qt: panels of Dq pair rows × 32 pair words (panel pn at qt + pn·Dq·32; Dq a multiple of 16,
// zero rows past the real ⌈Dk/2⌉). K: key tile t < nk/16 (whole 16-row tiles) is rows
// k + 16t·ldk (elements), 2·Dq bf16 each; the tile of the last nk % 16 keys is ktail (16 rows
// of 2·Dq elements, zero past the real keys and past Dk). s: (nk, ldS) floats; cbuf:
// kAmxStageFloats floats, 64-byte aligned. colmax (32·panels floats, 64-byte aligned):
// colmax[c] = max_j s[j][c], taken from the staged tiles on their way to Sᵀ (the softmax's
// first pass, without reading Sᵀ again; softmax_bf16 says when it may be used). c2 == 1 (the
// caller's unscaled Sᵀ, softmax_bf16's raw_scale): whole key tiles go to Sᵀ straight from the
// tile registers and their max is read back from L1 — one tile store instead of a store to the
// staging buffer, a load, a multiply and a store per row.
void qk_amx(const std::uint32_t* qt, int Dq, int panels, const std::uint16_t* k, std::int64_t ldk,
            const std::uint16_t* ktail, int nk, float c2, float* s, int ldS, float* cbuf, float* colmax);

// acc[d][c] += Σ_k Vᵀ[d][k]·P[k][c]   for d < Dv, c < 32·panels (no α: the caller scaled acc).
// pp: Jq pair rows × ldP words (Jq a multiple of 16; rows past the block's real keys zero);
// vt: Vᵀ in Jq/16 units of 32 keys, unit u at vt + u·Dv16·16 words (Dv16 = ⌈Dv/16⌉·16): Dv16
// rows of 16 words, word (d, k) = (V[32u+2k][d], V[32u+2k+1][d]), zero past the real keys and
// past Dv — so each A tile is 1 KiB in one piece (16 rows of 64 bytes), and a head's Vᵀ made
// once can be read from any unit on (AmxBf16Ops's head copy); acc: (Dv, ldO) floats (rows past
// Dv are not touched); cbuf as above.
void pv_amx(const std::uint32_t* pp, int ldP, const std::uint32_t* vt, int Jq, int Dv, int panels, float* acc, int ldO,
            float* cbuf);

}  // namespace attn::detail::flash_amx_bf16_ns
