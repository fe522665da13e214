// fma_ceiling_lab's AVX2 loops: the avx2 GEMM row's tile, 6 rows × 2 vectors of 8 (12 accumulators).
#include <immintrin.h>

namespace fma_ceiling::avx2 {
using Vec = __m256;
constexpr int kLanes = 8, kMR = 6, kNV = 2;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_load_ps(p); }
inline Vec vbroadcast(const float* p) { return _mm256_set1_ps(*p); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
}  // namespace fma_ceiling::avx2

#define FMA_CEILING_NS fma_ceiling::avx2
#include "fma_ceiling_tile.inl"
