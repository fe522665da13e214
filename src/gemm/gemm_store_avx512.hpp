// The two ends of an AVX-512 GEMM micro-tile, shared by the float32 micro-kernel
// (gemm_avx512.cpp) and the bf16 pair one (gemm_avx512_bf16.cpp): fetching C's rows before the
// K loop, and the store (beta, bias) after it. Included inside each file's own ATTN_GEMM_NS
// (an unnamed namespace: every file compiles its own copy with its own flags).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace attn::detail {
namespace ATTN_GEMM_NS {
namespace {

// C's rows are needed only after the K loop; fetching them now hides their miss (C of S6's QKV
// GEMM is 19 MB: from L3 or memory, once per K chunk). With beta = 0 too: the stores would miss
// on them (write-allocate) at the end of the tile.
template <int MR, int NV>
inline void prefetch_c(const float* c, std::int64_t ldc) {
    for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16 * v), _MM_HINT_T0);
}

// c (MR × 16·NV) = acc + beta·c, or acc + bias[j] (beta = 0; the bits of C = bias, beta = 1).
template <int MR, int NV>
inline void store_tile(__m512 (&acc)[MR][NV], float* c, std::int64_t ldc, float beta, const float* bias) {
    if (bias != nullptr) {
        for (int v = 0; v < NV; ++v) {
            const __m512 bv = _mm512_loadu_ps(bias + 16 * v);
            for (int r = 0; r < MR; ++r) _mm512_storeu_ps(c + r * ldc + 16 * v, _mm512_add_ps(acc[r][v], bv));
        }
    } else if (beta == 0.0f) {
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
    } else {
        const __m512 bt = _mm512_set1_ps(beta);
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v) {
                float* p = c + r * ldc + 16 * v;
                _mm512_storeu_ps(p, _mm512_fmadd_ps(bt, _mm512_loadu_ps(p), acc[r][v]));
            }
    }
}

}  // namespace
}  // namespace ATTN_GEMM_NS
}  // namespace attn::detail
