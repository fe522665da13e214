// The backward tile with its five products on bf16 pairs (vdpbf16ps, float32 accumulation):
// KernelSet::backward_tile_bf16 of the avx512 row, called by flash_backward.cpp only when
// Q, K, V, O, dO and the gradients are all bfloat16 and the CPU has AVX-512 BF16 (the forward's
// rule, isa.hpp; docs/conventions.md "bf16 compute" states the bound). This file alone of the
// backward is compiled with ATTN_AVX512_BF16_FLAGS (src/CMakeLists.txt).
//
// The element-wise steps (exp, dS, softcap, dropout, non-finite dO) are tile_body.inl's in
// float32, as on the avx512 row; only the products change. Their operands (tile.hpp,
// TileBf16) are pair words along each product's reduction dimension: Q, K, V, dO are packed
// by the driver (once per task or key block; exact, the inputs are bf16); P̂ and dS, the only
// values rounded here, are packed per tile: P̂ and dS as pairs along the query rows (for
// dV += P̂ᵀ·dO and dK += dSᵀ·Q), dS as bf16 rows (for dQ += dS·K).
//
// GEMM micro-kernel: tile_avx512.cpp's 8×32 block (16 zmm accumulators) with one vdpbf16ps
// (two products per lane) where the float32 tile has one FMA: per pair step, two loads of
// B pair words, eight broadcast A pair words, 16 vdpbf16ps.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../finite.hpp"
#include "../flash/bf16_dot.hpp"
#include "../isa.hpp"
#include "../simd/exp2_avx512.hpp"
#include "../simd/tanh.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

#include "tile_avx512_rows.inl"

inline __m512bh pairs(__m512i x) { return (__m512bh)x; }

// One pair word broadcast to 16 lanes; memcpy because A may be a bf16 (uint16) array read
// as words (Q/dO/dS rows), which a uint32 load would read through the wrong type.
inline __m512bh bcast(const std::uint32_t* p) {
    int w;
    std::memcpy(&w, p, sizeof w);
    return pairs(_mm512_set1_epi32(w));
}

// C(MR × 16·NV) (+)= Σ_{p < KP} A(r, p) ·pair B(p, ·); A(r, p) = a[r·a_rs + p·a_ks] (one pair
// word), B rows of pair words with stride ldb; the last vector under `last`.
template <int MR, int NV>
inline void ukernel(int KP, const std::uint32_t* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const std::uint32_t* b,
                    std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate, __mmask16 last) {
    static_assert(MR >= 1 && MR <= 8 && (NV == 1 || NV == 2));
    const __mmask16 m0 = NV == 1 ? last : static_cast<__mmask16>(0xFFFF);
    const __mmask16 m1 = last;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
#define ATTN_ROWS(X) \
    X(0, c00, c01) X(1, c10, c11) X(2, c20, c21) X(3, c30, c31) X(4, c40, c41) X(5, c50, c51) X(6, c60, c61) X(7, c70, c71)
#define ATTN_LOAD(r, x0, x1)                                                    \
    if constexpr (MR > r) {                                                     \
        x0 = _mm512_maskz_loadu_ps(m0, c + r * ldc);                            \
        if constexpr (NV == 2) x1 = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16); \
    }
    if (accumulate) { ATTN_ROWS(ATTN_LOAD) }
#define ATTN_DOT(r, x0, x1)                                                              \
    if constexpr (MR > r) {                                                              \
        const __m512bh av = bcast(a + r * a_rs + o);                                      \
        x0 = _mm512_dpbf16_ps(x0, av, b0);                                               \
        if constexpr (NV == 2) x1 = _mm512_dpbf16_ps(x1, av, b1);                        \
    }
    std::ptrdiff_t o = 0;
    for (int k = 0; k < KP; ++k, o += a_ks, b += ldb) {
        const __m512bh b0 = pairs(NV == 1 ? _mm512_maskz_loadu_epi32(m0, b) : _mm512_loadu_si512(b));
        const __m512bh b1 = NV == 2 ? pairs(_mm512_maskz_loadu_epi32(m1, b + 16)) : b0;
        ATTN_ROWS(ATTN_DOT)
    }
#define ATTN_STORE(r, x0, x1)                                                   \
    if constexpr (MR > r) {                                                     \
        _mm512_mask_storeu_ps(c + r * ldc, m0, x0);                             \
        if constexpr (NV == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, x1); \
    }
    ATTN_ROWS(ATTN_STORE)
#undef ATTN_ROWS
#undef ATTN_LOAD
#undef ATTN_DOT
#undef ATTN_STORE
}

template <int NV>
inline void ukernel_rows(int mr, int KP, const std::uint32_t* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks,
                         const std::uint32_t* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool acc, __mmask16 last) {
    switch (mr) {
        case 8: ukernel<8, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 7: ukernel<7, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 6: ukernel<6, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 5: ukernel<5, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 4: ukernel<4, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 3: ukernel<3, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 2: ukernel<2, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        default: ukernel<1, NV>(KP, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
    }
}

// C(M×N) (+)= A·B over KP pair steps, N % 8 == 0; the order of tile_avx512.cpp's gemm.
void gemm_pairs(int M, int N, int KP, const std::uint32_t* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks,
                const std::uint32_t* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate) {
    for (int n0 = 0; n0 < N; n0 += 32) {
        const int w = N - n0 < 32 ? N - n0 : 32;
        for (int m0 = 0; m0 < M; m0 += 8) {
            const int mr = M - m0 < 8 ? M - m0 : 8;
            if (w > 16)
                ukernel_rows<2>(mr, KP, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate,
                                lanes(w - 16));
            else
                ukernel_rows<1>(mr, KP, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate,
                                lanes(w));
        }
    }
}

// A bf16 row (2-byte elements, even stride) read as pair words.
inline const std::uint32_t* words(const std::uint16_t* p) { return reinterpret_cast<const std::uint32_t*>(p); }

// S = Q·Kᵀ over ⌈Dk/2⌉ pairs of d (the padding column of an odd Dk is 0 in both).
inline void scores_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    gemm_pairs(t.br, t.bcp, (t.Dk + 1) / 2, words(z.q), z.ldq / 2, 1, z.kt_pairs, t.bcp, t.S, t.bcp, false);
}
// dP = dO·Vᵀ over ⌈Dv/2⌉ pairs of d.
inline void dp_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    gemm_pairs(t.br, t.bcp, (t.Dv + 1) / 2, words(z.dO), z.ldo / 2, 1, z.vt_pairs, t.bcp, t.dP, t.bcp, false);
}
// dV += P̂ᵀ·dO over ⌈br/2⌉ pairs of query rows: P̂ rounded to bf16 here.
inline void dv_product(const TileArgs& t, const float* pv) {
    const TileBf16& z = *t.bf16;
    flash_bf16_avx512_ns::pack_pairs_bf16(pv, t.bcp, t.br, t.bcp, z.p_pairs, t.bcp);
    gemm_pairs(t.bc, t.Dvp, (t.br + 1) / 2, z.p_pairs, 1, t.bcp, z.dO_pairs, t.Dvp, t.dv, t.Dvp, true);
}
// dK += dSᵀ·Q over ⌈br/2⌉ pairs of query rows: dS rounded to bf16 here (a tiny scale is not:
// flash_backward.cpp, split_scale).
inline void dk_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    flash_bf16_avx512_ns::pack_pairs_bf16(t.dP, t.bcp, t.br, t.bcp, z.p_pairs, t.bcp);
    gemm_pairs(t.bc, t.Dkp, (t.br + 1) / 2, z.p_pairs, 1, t.bcp, z.q_pairs, t.Dkp, t.dk, t.Dkp, true);
}
// dQ += dS·K over ⌈bc/2⌉ pairs of keys (dS of a padded key is 0, K's pair past an odd bc 0).
inline void dq_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    for (int i = 0; i < t.br; ++i) {
        const float* src = t.dP + static_cast<std::ptrdiff_t>(i) * t.bcp;
        std::uint16_t* dst = z.ds_rows + static_cast<std::ptrdiff_t>(i) * t.bcp;
        for (int j = 0; j < t.bcp; j += 16) {  // bcp % 8 == 0: the last step may be 8 lanes
            const __mmask16 m = lanes(t.bcp - j);
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + j));
            _mm256_mask_storeu_epi16(dst + j, m, (__m256i)h);
        }
    }
    gemm_pairs(t.br, t.Dkp, (t.bc + 1) / 2, words(z.ds_rows), t.bcp / 2, 1, z.k_pairs, t.Dkp, t.dq, t.lddq, true);
}

#include "tile_body.inl"

}  // namespace

void backward_tile_avx512_bf16(const TileArgs& t) { tile_body(t); }

}  // namespace attn::detail
