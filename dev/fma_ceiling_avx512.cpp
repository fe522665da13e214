// fma_ceiling_lab's AVX-512 loops: the avx512 GEMM row's tile, 6 rows × 4 vectors of 16 (24 accumulators).
#include <immintrin.h>

namespace fma_ceiling::avx512 {
using Vec = __m512;
constexpr int kLanes = 16, kMR = 6, kNV = 4;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_load_ps(p); }
inline Vec vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
}  // namespace fma_ceiling::avx512

#define FMA_CEILING_NS fma_ceiling::avx512
#include "fma_ceiling_tile.inl"
