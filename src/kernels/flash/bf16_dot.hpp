// The bf16 dot-product micro-kernels of the flash forward (flash_avx512_bf16.cpp, compiled
// with ATTN_AVX512_BF16_FLAGS): Sᵀ = K·Qᵀ and Oᵀ += V·Pᵀ on *pairs* of bf16 with float32
// accumulation, one `vdpbf16ps` (_mm512_dpbf16_ps) per 16 lanes × 2 products.
//
// vdpbf16ps multiplies the two bf16 halves of each 32-bit lane of one operand with the two
// halves of the same lane of the other and adds both products to the float32 lane. So both
// operands hold pairs of adjacent elements *along the reduction dimension*:
//   Q·Kᵀ reduces over d:   Q packed as pair words qp[d/2][query] = (Q[q][d], Q[q][d+1]),
//                          K rows read in place (K[j][d], K[j][d+1] are adjacent already).
//   P·V  reduces over keys: Pᵀ packed as pp[j/2][query] = (P[j][q], P[j+1][q]),
//                          V as vp[j/2][d] = (V[j][d], V[j+1][d]).
// A pair word holds the first element in its low 16 bits (little-endian memory order). An
// odd length is padded with a zero element. The tiles are those of the AVX-512 f32 path
// (flash_avx512.cpp): 8 rows × 32 queries = 16 zmm accumulators, 2 pair vectors per step, and
// for two adjacent panels 6 rows × 64 queries = 24 accumulators, 4 pair vectors per step (the
// _pair functions).
//
// Only flash_avx512.cpp's bf16 Ops call these, and only on a CPU with AVX-512 BF16
// (flash.cpp checks cpu_features().avx512_bf16). Denormal bf16 inputs count as 0 in
// vdpbf16ps, and a denormal result is flushed to 0.
#pragma once

#include <cstdint>

namespace attn::detail::flash_bf16_avx512_ns {

// s[r][0..32) = c2 · Σ_{p < Dp} dot2(k[r] pair p, qp[p][0..32))  for r < rows (1..8).
// qp: (Dp, 32) pair words, 64-byte aligned; k: bf16 rows, row r at k + r·ldk (elements),
// pair p at element 2p (2·Dp elements readable per row); s: (rows, ldS) floats, aligned.
void qk_bf16(const std::uint32_t* qp, const std::uint16_t* k, std::int64_t ldk, int rows, int Dp, float c2, float* s,
             int ldS);

// qk_bf16 with c2 = 1 (the sums unscaled: the softmax folds the scale into its exponent,
// softmax_bf16's raw_scale) and cmax[0..32) = max_{r < rows} s[r][0..32), max-ed into cmax's
// values unless first — a block's column maxima found in the store, so the softmax skips its
// pass over Sᵀ for them. cmax: 64-byte aligned.
void qk_bf16_raw(const std::uint32_t* qp, const std::uint16_t* k, std::int64_t ldk, int rows, int Dp, float* s, int ldS,
                 float* cmax, bool first);

// ot[r][0..32) = alpha·ot[r] + Σ_{p < Jp} dot2(v[p][r], pp[p][0..32))  for r < rows (1..8).
// pp: (Jp, ldP) pair words (64-byte aligned rows); v: (Jp, ldv) pair words; ot: (rows, ldO).
// alpha = nullptr: every α is 1 (no rescale; the caller checked).

void pv_bf16(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, int rows, float* ot,
             int ldO, const float* alpha);

// qk_bf16 / qk_bf16_raw (cmax != nullptr) and pv_bf16 on two adjacent panels at once, 64 queries ×
// rows ≤ 6: Qᵀ pairs of the two panels at qp0 and qp1, Sᵀ, cmax, Pᵀ, Oᵀ and alpha 64 wide. The same bits.
void qk_bf16_pair(const std::uint32_t* qp0, const std::uint32_t* qp1, const std::uint16_t* k, std::int64_t ldk, int rows,
                  int Dp, float c2, float* s, int ldS, float* cmax, bool first);
void pv_bf16_pair(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, int rows, float* ot,
                  int ldO, const float* alpha);

// dst[p][c] = (bf16(src[2p][c]), bf16(src[2p+1][c])) for p < ⌈n/2⌉, c < cols, each rounded
// to nearest even (NaN stays NaN); the row past an odd n is 0. src: (n, ld) floats, any
// alignment; dst: rows of ld_dst words.
void pack_pairs_bf16(const float* src, std::int64_t ld, std::int64_t n, std::int64_t cols, std::uint32_t* dst,
                     std::int64_t ld_dst);

// The online-softmax update of one key block on the bf16 path: as Avx512Ops::softmax
// (flash_avx512.cpp; m, l, alpha per column, Sᵀ (nk, ldS) in, 16 columns at a time), but m moves
// only where the block's max passes it by more than 8 in base 2 (the lazy rescale: elsewhere
// α = 1 and the weights, ≤ 2^8, are taken against the old m; flash_avx512_bf16.cpp, lazy_max), and
// each weight from exp2_bf16 below instead of the float32 exp2 (α keeps the float32 one: an error
// there would compound over the key blocks in l, see exp2_bf16), and the weights leave as bf16
// pair words pp[j/2][c] = (bf16(P[j][c]), bf16(P[j+1][c])) (ldP words a row, 64-byte aligned; a
// zero element past an odd nk) — the rounding pack_pairs_bf16 does, without a second pass over
// Sᵀ. pp = nullptr: no pairs. keep_f32: Sᵀ is overwritten with the float32 P (dropout,
// the non-finite paths and the careful path read it); false leaves Sᵀ as it was.
// colmax: the block's column maxima max_j Sᵀ[j][c] (64-byte aligned), when the product that
// wrote Sᵀ found them on the way (qk_amx, qk_bf16_raw) — saves the softmax its first pass over
// Sᵀ; nullptr: found here. raw_scale > 0 (finite, and raw_scale·log2 e a normal float): Sᵀ — and
// colmax, which must then be given — hold the unscaled products K·Qᵀ (qk_amx with c2 = 1, whole
// tiles stored straight from the tile registers; qk_bf16_raw); the scores are raw_scale·Sᵀ, the scale folded into
// the exponent's multiply. m, α and the weights' bound are the scaled path's (m's bits too);
// the weights' bits may differ (one FMA for scale, subtract and multiply: a relative ≤ 4.6e-5 in
// a weight where the column max |m| ≤ 2^8; larger maxima take the scaled path's form and bits).
// 0: Sᵀ holds the scores.
void softmax_bf16(float* s, int ldS, int nk, int ncols, float* m, float* l, float* alpha, std::uint32_t* pp, int ldP,
                  bool keep_f32, const float* colmax = nullptr, float raw_scale = 0.0f);

// 2^x for n values, the exp of softmax_bf16 (for tests: tests/kernels/test_bf16_compute.cpp).
// Degree-3 polynomial on the reduced argument: relative error ≤ 1.05e-4 (< 2^-13) on x ≤ 8,
// where softmax_bf16 uses it; exactly 0 below −126 and for −inf, NaN stays NaN, 2^n exact at
// integers n (2^0 = 1). softmax_bf16 hands its exp x + 1/2 from its FMA; this adds the 1/2.
void exp2_bf16(const float* x, float* y, int n);

}  // namespace attn::detail::flash_bf16_avx512_ns
