// AVX2+FMA tile of the tiled backward and the AVX2 dropout rows. The only backward file
// compiled with the AVX2 flags (src/CMakeLists.txt: ATTN_AVX2_SOURCES); reached only through
// the kernel table's AVX2 row (isa.cpp).
//
// GEMM micro-kernel: a 6×16 block of C in 12 ymm accumulators; per k, two loads of a B
// row and six broadcasts of A feed 12 FMAs (Zen 3: 2 FMA + 3 loads per cycle → FMA-bound).
#include <immintrin.h>

#include <cstddef>

#include "../../core/dropout.hpp"
#include "../finite.hpp"
#include "../isa.hpp"
#include "../simd/tanh.hpp"
#include "../simd/exp2_avx2.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

// Accumulators are named variables, not an array: with `__m256 acc[MR][NV]` GCC keeps
// them in registers but also stores every one to the stack on each k (measured: 12
// stores per 12 FMAs, store-bound at ~60% of FMA peak).
template <int MR, int NV>
inline void ukernel(int K, const float* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const float* b,
                    std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate) {
    static_assert(MR >= 1 && MR <= 6 && (NV == 1 || NV == 2));
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define ATTN_ROWS(X) X(0, c00, c01) X(1, c10, c11) X(2, c20, c21) X(3, c30, c31) X(4, c40, c41) X(5, c50, c51)
#define ATTN_LOAD(r, x0, x1)                                                \
    if constexpr (MR > r) {                                                 \
        x0 = _mm256_loadu_ps(c + r * ldc);                                  \
        if constexpr (NV == 2) x1 = _mm256_loadu_ps(c + r * ldc + 8);       \
    }
    if (accumulate) { ATTN_ROWS(ATTN_LOAD) }
#define ATTN_FMA(r, x0, x1)                                                 \
    if constexpr (MR > r) {                                                 \
        const __m256 av = _mm256_broadcast_ss(a##r##p + o);                 \
        x0 = _mm256_fmadd_ps(av, b0, x0);                                   \
        if constexpr (NV == 2) x1 = _mm256_fmadd_ps(av, b1, x1);            \
    }
    // Row pointers of A (the unused ones are never dereferenced).
    const float* a0p = a;
    const float* a1p = a + a_rs;
    const float* a2p = a + 2 * a_rs;
    const float* a3p = a + 3 * a_rs;
    const float* a4p = a + 4 * a_rs;
    const float* a5p = a + 5 * a_rs;
    std::ptrdiff_t o = 0;
    for (int k = 0; k < K; ++k, o += a_ks, b += ldb) {
        const __m256 b0 = _mm256_loadu_ps(b);
        const __m256 b1 = NV == 2 ? _mm256_loadu_ps(b + 8) : b0;
        ATTN_ROWS(ATTN_FMA)
    }
#define ATTN_STORE(r, x0, x1)                                               \
    if constexpr (MR > r) {                                                 \
        _mm256_storeu_ps(c + r * ldc, x0);                                  \
        if constexpr (NV == 2) _mm256_storeu_ps(c + r * ldc + 8, x1);       \
    }
    ATTN_ROWS(ATTN_STORE)
#undef ATTN_ROWS
#undef ATTN_LOAD
#undef ATTN_FMA
#undef ATTN_STORE
    (void)a0p; (void)a1p; (void)a2p; (void)a3p; (void)a4p; (void)a5p;
}

template <int NV>
inline void ukernel_rows(int mr, int K, const float* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const float* b,
                         std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool acc) {
    switch (mr) {
        case 6: ukernel<6, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc); break;
        case 5: ukernel<5, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc); break;
        case 4: ukernel<4, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc); break;
        case 3: ukernel<3, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc); break;
        case 2: ukernel<2, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc); break;
        default: ukernel<1, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc); break;
    }
}

// C(M×N) (+)= A(M×K)·B(K×N), N % 8 == 0. Column panels outermost so a K×16 panel of B
// stays in L1 while the row blocks stream past it.
// (No requests: the driver gives RowsAhead to the avx512 tile only.)
void gemm(int M, int N, int K, const float* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const float* b,
          std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate, RowsAhead* = nullptr) {
    int n0 = 0;
    for (; n0 + 16 <= N; n0 += 16)
        for (int m0 = 0; m0 < M; m0 += 6)
            ukernel_rows<2>(M - m0 < 6 ? M - m0 : 6, K, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0,
                            ldc, accumulate);
    if (n0 < N)
        for (int m0 = 0; m0 < M; m0 += 6)
            ukernel_rows<1>(M - m0 < 6 ? M - m0 : 6, K, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0,
                            ldc, accumulate);
}

void exp_row(float* s, int n, float scale, float neg_lse) {
    const __m256 vs = _mm256_set1_ps(scale), vn = _mm256_set1_ps(neg_lse), l2e = _mm256_set1_ps(kTileLog2e);
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int j = 0; j < n; j += 8)  // n % 8 == 0; P <= 1 (tile.hpp): min(1, p) keeps a NaN p
        _mm256_storeu_ps(s + j, _mm256_min_ps(one, exp2_ps(_mm256_mul_ps(_mm256_fmadd_ps(_mm256_loadu_ps(s + j), vs, vn), l2e))));
}

void ds_row(const float* p, float* dp, int n, float D, float scale) {
    const __m256 vd = _mm256_set1_ps(D), vs = _mm256_set1_ps(scale), zero = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        const __m256 pv = _mm256_loadu_ps(p + j);
        const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(vs, pv), _mm256_sub_ps(_mm256_loadu_ps(dp + j), vd));
        _mm256_storeu_ps(dp + j, _mm256_andnot_ps(_mm256_cmp_ps(pv, zero, _CMP_EQ_OQ), ds));
    }
}

#include "tile_products_f32.inl"
#include "tile_body.inl"

}  // namespace

void backward_tile_avx2(const TileArgs& t) { tile_body(t); }

// Philox4x32-10 on 8 counters at once (lanes = consecutive j4). The 32×32→64 products
// come from _mm256_mul_epu32 on the even lanes and on the odd lanes shifted down.
void dropout_row_avx2(const DropoutRowArgs& a) {
    const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
    const __m256i w0 = _mm256_set1_epi32(static_cast<int>(0x9E3779B9u));
    const __m256i w1 = _mm256_set1_epi32(static_cast<int>(0xBB67AE85u));
    const __m256i thr = _mm256_set1_epi32(static_cast<int>(a.threshold));
    const __m256 scale = _mm256_set1_ps(a.scale);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    auto mulhilo = [](__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
        const __m256i even = _mm256_mul_epu32(x, m);
        const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
        lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
        hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    };
    for (int t0 = 0; t0 < a.n4; t0 += 8) {
        __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(a.j4 + static_cast<std::uint32_t>(t0))), lane);
        __m256i c1 = _mm256_set1_epi32(static_cast<int>(a.i));
        __m256i c2 = _mm256_set1_epi32(static_cast<int>(a.h));
        __m256i c3 = _mm256_set1_epi32(static_cast<int>(a.b));
        __m256i k0 = _mm256_set1_epi32(static_cast<int>(a.key0)), k1 = _mm256_set1_epi32(static_cast<int>(a.key1));
        for (int r = 0; r < 10; ++r) {
            if (r > 0) {
                k0 = _mm256_add_epi32(k0, w0);
                k1 = _mm256_add_epi32(k1, w1);
            }
            __m256i hi0, lo0, hi1, lo1;
            mulhilo(c0, m0, hi0, lo0);
            mulhilo(c2, m1, hi1, lo1);
            c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0);
            c1 = lo1;
            c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1);
            c3 = lo0;
        }
        // keep iff word >= threshold (unsigned): max(word, thr) == word
        alignas(32) float f[4][8];
        const __m256i words[4] = {c0, c1, c2, c3};
        for (int w = 0; w < 4; ++w) {
            const __m256i keep = _mm256_cmpeq_epi32(_mm256_max_epu32(words[w], thr), words[w]);
            _mm256_store_ps(f[w], _mm256_and_ps(_mm256_castsi256_ps(keep), scale));
        }
        const int n = a.n4 - t0 < 8 ? a.n4 - t0 : 8;
        for (int t = 0; t < n; ++t)
            for (int w = 0; w < 4; ++w) a.out[4 * (t0 + t) + w] = f[w][t];
    }
}

}  // namespace attn::detail
