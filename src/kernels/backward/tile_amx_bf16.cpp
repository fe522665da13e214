// The backward tile with its five products on AMX tiles (tdpbf16ps: 16×16 float32 += 16×32
// bf16 · 16 pair rows × 16 pair words): KernelSet::backward_tile_amx of the avx512 row, called
// by flash_backward.cpp instead of the vdpbf16ps tile (tile_avx512_bf16.cpp) under the same rule
// — all-bf16 tensors — when cpu_features().has_amx_bf16() (backward_compute: Compute::bf16_amx).
// The rounding is that tile's (docs/conventions.md "bf16 compute"): the same operands rounded
// to bf16 (P̂ and dS here), float32 sums of exact products; only the order of the sums differs.
// This file alone of the backward is compiled with ATTN_AMX_BF16_FLAGS (src/CMakeLists.txt).
//
// The element-wise steps are tile_body.inl's, as on the avx512 row; the operands are the
// driver's TileBf16 (tile.hpp), read in place by the tile loads:
//   S  = Q·Kᵀ    A = Q bf16 rows (z.q)      B = Kᵀ pairs along d (kt_pairs)   C = S
//   dP = dO·Vᵀ   A = dO bf16 rows (z.dO)    B = Vᵀ pairs (vt_pairs)           C = dP
//   dV += P̂ᵀ·dO  A = P̂ᵀ bf16 rows, packed here (pack_transposed_pairs)  B = dO_pairs  C = dv
//   dK += dSᵀ·Q  A = dSᵀ bf16 rows, packed here                          B = q_pairs   C = dk
//   dQ += dS·K   A = dS bf16 rows (ds_bf16_rows)                         B = k_pairs   C = dq
// A pair word holds two bf16 adjacent along the reduction; a bf16 row read as words is the A
// operand of both tdpbf16ps and the vector micro-kernel (A(r, k) = the k-th word of row r).
//
// Blocking (gemm_amx): C blocks of 32×32 (four accumulator tiles, two A and two B tiles: all
// eight tmm), 16 pairs (32 bf16) of the reduction per step. Whatever does not fill a 16×16×32
// block — rows of a short query or key block (br, bc not a multiple of 16), a column edge
// (Dkp, Dvp or bcp % 16 == 8), a reduction edge (Dk, Dv not a multiple of 32, br or bc not a
// multiple of 32) — runs on tile_avx512_gemm.inl's vdpbf16ps micro-kernel over the same
// operands, so no tile load reads a byte past the operands the vector tile reads and no
// scratch needs zero padding. (S1–S3, head dims 64 and 128, full 64×64 tiles: all on AMX.)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../finite.hpp"
#include "../isa.hpp"
#include "../simd/amx_tiles.hpp"
#include "../simd/exp2_avx512.hpp"
#include "../simd/tanh.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

#include "tile_avx512_rows.inl"

#include "tile_avx512_gemm.inl"

#include "tile_bf16_pairs.inl"

// tmm0..3: the accumulators C(0,0), C(0,1), C(1,0), C(1,1) of a 32×32 block; tmm4, 5: A of
// row blocks 0, 1; tmm6, 7: B of column blocks 0, 1. Tile numbers are immediates, hence the
// template over the block's row and column tile counts (1 or 2).
// C(16·MB × 16·NB) (+)= A·B over k16 steps of 16 pairs; A rows lda words apart, B rows ldb.
template <int MB, int NB>
void amx_block(int k16, const std::uint32_t* a, std::ptrdiff_t lda, const std::uint32_t* b, std::ptrdiff_t ldb,
               float* c, std::ptrdiff_t ldc, bool accumulate) {
    const std::ptrdiff_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;  // strides in bytes
    float* c1 = c + 16 * ldc;
    if (accumulate) {
        ATTN_TILE_LOAD(0, c, sc);
        if constexpr (NB == 2) ATTN_TILE_LOAD(1, c + 16, sc);
        if constexpr (MB == 2) ATTN_TILE_LOAD(2, c1, sc);
        if constexpr (MB == 2 && NB == 2) ATTN_TILE_LOAD(3, c1 + 16, sc);
    } else {
        _tile_zero(0);
        if constexpr (NB == 2) _tile_zero(1);
        if constexpr (MB == 2) _tile_zero(2);
        if constexpr (MB == 2 && NB == 2) _tile_zero(3);
    }
    for (int k = 0; k < k16; ++k) {
        const std::uint32_t* ak = a + 16 * k;
        const std::uint32_t* bk = b + 16 * k * ldb;
        ATTN_TILE_LOAD(4, ak, sa);
        if constexpr (MB == 2) ATTN_TILE_LOAD(5, ak + 16 * lda, sa);
        ATTN_TILE_LOAD(6, bk, sb);
        if constexpr (NB == 2) ATTN_TILE_LOAD(7, bk + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (NB == 2) _tile_dpbf16ps(1, 4, 7);
        if constexpr (MB == 2) _tile_dpbf16ps(2, 5, 6);
        if constexpr (MB == 2 && NB == 2) _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, sc);
    if constexpr (NB == 2) _tile_stored(1, c + 16, sc);
    if constexpr (MB == 2) _tile_stored(2, c1, sc);
    if constexpr (MB == 2 && NB == 2) _tile_stored(3, c1 + 16, sc);
}

// C(M×N) (+)= A(M×K)·B(K×N) over K pair words, N % 8 == 0: A(r, k) = a[r·lda + k] (bf16 rows
// read as words), B(k, n) = b[k·ldb + n]. The full 16-row, 16-column, 16-pair blocks on AMX,
// the rest on the vector micro-kernel: the reduction's tail over the AMX blocks (accumulated
// onto them), then the column edge and the row edge over the whole reduction.
void gemm_amx(int M, int N, int K, const std::uint32_t* a, std::ptrdiff_t lda, const std::uint32_t* b,
              std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate) {
    const int Mf = M / 16 * 16, Nf = N / 16 * 16, Kf = K / 16 * 16;
    if (Mf == 0 || Nf == 0 || Kf == 0) {
        gemm(M, N, K, a, lda, 1, b, ldb, c, ldc, accumulate);
        return;
    }
    for (int m0 = 0; m0 < Mf; m0 += 32)
        for (int n0 = 0; n0 < Nf; n0 += 32) {
            const std::uint32_t* am = a + m0 * lda;
            const std::uint32_t* bn = b + n0;
            float* cmn = c + m0 * ldc + n0;
            const bool two_m = Mf - m0 >= 32, two_n = Nf - n0 >= 32;
            if (two_m && two_n) amx_block<2, 2>(Kf / 16, am, lda, bn, ldb, cmn, ldc, accumulate);
            else if (two_m) amx_block<2, 1>(Kf / 16, am, lda, bn, ldb, cmn, ldc, accumulate);
            else if (two_n) amx_block<1, 2>(Kf / 16, am, lda, bn, ldb, cmn, ldc, accumulate);
            else amx_block<1, 1>(Kf / 16, am, lda, bn, ldb, cmn, ldc, accumulate);
        }
    if (Kf < K) gemm(Mf, Nf, K - Kf, a + Kf, lda, 1, b + Kf * ldb, ldb, c, ldc, true);
    if (Nf < N) gemm(Mf, N - Nf, K, a, lda, 1, b + Nf, ldb, c + Nf, ldc, accumulate);
    if (Mf < M) gemm(M - Mf, N, K, a + Mf * lda, lda, 1, b, ldb, c + Mf * ldc, ldc, accumulate);
}

// x[0..16) ← its transpose as a 16×16 matrix of 32-bit words (x[r] lane e → x[e] lane r):
// 32-bit, then 64-bit interleaves within 128-bit lanes, then two 128-bit lane shuffles.
inline void transpose16(__m512i x[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
    }
    // u[4g + c], 128-bit lane L: column 4L + c of rows 4g..4g+3
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512i lo01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);   // lanes 0,1 of rows 0–3, 4–7
        const __m512i hi01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);   // lanes 2,3
        const __m512i lo23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        const __m512i hi23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        x[c] = _mm512_shuffle_i32x4(lo01, lo23, 0x88);
        x[4 + c] = _mm512_shuffle_i32x4(lo01, lo23, 0xDD);
        x[8 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0x88);
        x[12 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0xDD);
    }
}

// The words of rows 2p and 2p+1 of x, 16 columns: bf16(lo[j]) | bf16(hi[j]) << 16, each rounded
// to nearest even (vcvtne2ps2bf16, as pack_pairs_bf16 and ds_bf16_rows round).
inline __m512i pair_words(__m512 lo, __m512 hi) {
    alignas(64) static constexpr short kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// Word p of row j of t (ldt words a row) = (bf16 x[2p][j], bf16 x[2p+1][j]) for j < bc and
// p < ⌈br/2⌉ rounded up to 16 — the A of dV += P̂ᵀ·dO and dK += dSᵀ·Q as bf16 rows along the
// queries; a row past br gives 0 halves. x: (br, bcp) float32, row stride bcp. One pass over
// x: 16 pair words of 16 keys built from 32 rows, then transposed in registers.
void pack_transposed_pairs(const float* x, int br, int bc, int bcp, std::uint32_t* t, std::ptrdiff_t ldt) {
    const int np = (br + 1) / 2;
    for (int p0 = 0; p0 < np; p0 += 16)
        for (int j0 = 0; j0 < bc; j0 += 16) {
            const __mmask16 m = lanes(bcp - j0);
            __m512i w[16];
            for (int q = 0; q < 16; ++q) {
                const int r = 2 * (p0 + q);
                const float* row = x + static_cast<std::ptrdiff_t>(r) * bcp + j0;
                const __m512 lo = r < br ? _mm512_maskz_loadu_ps(m, row) : _mm512_setzero_ps();
                const __m512 hi = r + 1 < br ? _mm512_maskz_loadu_ps(m, row + bcp) : _mm512_setzero_ps();
                w[q] = pair_words(lo, hi);
            }
            transpose16(w);
            const int keys = bc - j0 < 16 ? bc - j0 : 16;
            for (int k = 0; k < keys; ++k) _mm512_storeu_si512(t + (j0 + k) * ldt + p0, w[k]);
        }
}

// The P̂ᵀ / dSᵀ rows: z.ds_rows' storage (64 rows of 32 words), free until dq_product
// writes dS rows there.
constexpr std::ptrdiff_t kTransposedLd = 32;  // words: ⌈64/2⌉ pairs of queries
std::uint32_t* transposed_scratch(const TileArgs& t) { return reinterpret_cast<std::uint32_t*>(t.bf16->ds_rows); }

// S = Q·Kᵀ over ⌈Dk/2⌉ pairs of d (the padding column of an odd Dk is 0 in both).
inline void scores_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    gemm_amx(t.br, t.bcp, (t.Dk + 1) / 2, words(z.q), z.ldq / 2, z.kt_pairs, t.bcp, t.S, t.bcp, false);
}
// dP = dO·Vᵀ over ⌈Dv/2⌉ pairs of d.
inline void dp_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    gemm_amx(t.br, t.bcp, (t.Dv + 1) / 2, words(z.dO), z.ldo / 2, z.vt_pairs, t.bcp, t.dP, t.bcp, false);
}
// dV += P̂ᵀ·dO over ⌈br/2⌉ pairs of query rows: P̂ rounded to bf16 here.
inline void dv_product(const TileArgs& t, const float* pv) {
    const TileBf16& z = *t.bf16;
    std::uint32_t* pt = transposed_scratch(t);
    pack_transposed_pairs(pv, t.br, t.bc, t.bcp, pt, kTransposedLd);
    gemm_amx(t.bc, t.Dvp, (t.br + 1) / 2, pt, kTransposedLd, z.dO_pairs, t.Dvp, t.dv, t.Dvp, !t.dkv_first);
}
// dK += dSᵀ·Q over ⌈br/2⌉ pairs of query rows: dS rounded to bf16 here (a tiny scale is not:
// backward_plan.hpp, split_scale).
inline void dk_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    std::uint32_t* pt = transposed_scratch(t);
    pack_transposed_pairs(t.dP, t.br, t.bc, t.bcp, pt, kTransposedLd);
    gemm_amx(t.bc, t.Dkp, (t.br + 1) / 2, pt, kTransposedLd, z.q_pairs, t.Dkp, t.dk, t.Dkp, !t.dkv_first);
}
// dQ += dS·K over ⌈bc/2⌉ pairs of keys (dS of a padded key is 0, K's pair past an odd bc 0).
inline void dq_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    ds_bf16_rows(t.dP, t.br, t.bcp, z.ds_rows);
    gemm_amx(t.br, t.Dkp, (t.bc + 1) / 2, words(z.ds_rows), t.bcp / 2, z.k_pairs, t.Dkp, t.dq, t.lddq, !t.dq_first);
}

#include "tile_body.inl"

}  // namespace

// One tile configuration per call (simd/amx_tiles.hpp says why none survives a call).
void backward_tile_amx_bf16(const TileArgs& t) {
    const AmxTiles tiles;
    tile_body(t);
}

}  // namespace attn::detail
