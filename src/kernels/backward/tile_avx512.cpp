// AVX-512 tile of the tiled backward. The only backward file compiled with the AVX-512
// flags (src/CMakeLists.txt: ATTN_AVX512_SOURCES); reached only through the kernel table's
// avx512 row (isa.cpp). The tile itself is tile_body.inl, shared with the other ISAs.
//
// GEMM micro-kernel: an 8×32 block of C in 16 zmm accumulators; per k, two loads of a B
// row and eight A scalars broadcast from memory ({1to16} operands) feed 16 FMAs — 16
// independent chains cover 2 FMA pipes × 4 cycles of latency twice over. 8 rows divide the
// 64-row query block and 64-key block; the N edge (N % 8 == 0, not always % 16) is a
// masked last vector, so no column is read or written past N.
#include <immintrin.h>

#include <cstddef>

#include "../finite.hpp"
#include "../isa.hpp"
#include "../simd/exp2_avx512.hpp"
#include "../simd/tanh.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

#include "tile_avx512_rows.inl"

// Accumulators are named variables, not an array (the AVX2 tile's comment says why).
// NV vectors of 16 columns; the last one under `last` (all ones, or the N edge).
template <int MR, int NV>
inline void ukernel(int K, const float* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const float* b,
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
#define ATTN_FMA(r, x0, x1)                                                     \
    if constexpr (MR > r) {                                                     \
        const __m512 av = _mm512_set1_ps(a[r * a_rs + o]);                      \
        x0 = _mm512_fmadd_ps(av, b0, x0);                                       \
        if constexpr (NV == 2) x1 = _mm512_fmadd_ps(av, b1, x1);                \
    }
    std::ptrdiff_t o = 0;
    for (int k = 0; k < K; ++k, o += a_ks, b += ldb) {
        const __m512 b0 = NV == 1 ? _mm512_maskz_loadu_ps(m0, b) : _mm512_loadu_ps(b);
        const __m512 b1 = NV == 2 ? _mm512_maskz_loadu_ps(m1, b + 16) : b0;
        ATTN_ROWS(ATTN_FMA)
    }
#define ATTN_STORE(r, x0, x1)                                                   \
    if constexpr (MR > r) {                                                     \
        _mm512_mask_storeu_ps(c + r * ldc, m0, x0);                             \
        if constexpr (NV == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, x1); \
    }
    ATTN_ROWS(ATTN_STORE)
#undef ATTN_ROWS
#undef ATTN_LOAD
#undef ATTN_FMA
#undef ATTN_STORE
}

template <int NV>
inline void ukernel_rows(int mr, int K, const float* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const float* b,
                         std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool acc, __mmask16 last) {
    switch (mr) {
        case 8: ukernel<8, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 7: ukernel<7, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 6: ukernel<6, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 5: ukernel<5, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 4: ukernel<4, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 3: ukernel<3, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 2: ukernel<2, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        default: ukernel<1, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
    }
}


// C(M×N) (+)= A(M×K)·B(K×N), N % 8 == 0. Column panels of 32 outermost so a K×32 panel
// of B stays in L1 while the row blocks stream past it; the last panel (8, 16 or 24
// columns) runs under a mask.
void gemm(int M, int N, int K, const float* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const float* b,
          std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate) {
    for (int n0 = 0; n0 < N; n0 += 32) {
        const int w = N - n0 < 32 ? N - n0 : 32;
        for (int m0 = 0; m0 < M; m0 += 8) {
            const int mr = M - m0 < 8 ? M - m0 : 8;
            if (w > 16)
                ukernel_rows<2>(mr, K, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate,
                                lanes(w - 16));
            else
                ukernel_rows<1>(mr, K, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate,
                                lanes(w));
        }
    }
}

#include "tile_products_f32.inl"
#include "tile_body.inl"

}  // namespace

void backward_tile_avx512(const TileArgs& t) { tile_body(t); }

}  // namespace attn::detail
