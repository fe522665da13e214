// The AVX-512 FMA ceiling: built with -mavx512f, called only after cpu_has_avx512() said yes
// (so a CPU without AVX-512 never executes an instruction from here).
#include <immintrin.h>

#include "chains_avx512.hpp"
#include "peaks.hpp"

namespace attn::bench::detail {

// Each chain steps acc = acc·m + c: the AVX2 loop's step (peaks_avx2.cpp says why these
// constants) at the width of the avx512 row.
float fma_chains_avx512(long iters) {
    const __m512 m = _mm512_set1_ps(0.999f);
    const __m512 c = _mm512_set1_ps(0.001f);
    return chains_avx512(iters, [=](__m512 a) { return _mm512_fmadd_ps(a, m, c); });
}

}  // namespace attn::bench::detail
