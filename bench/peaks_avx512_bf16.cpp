// The AVX-512 BF16 ceiling (vdpbf16ps): built with -mavx512f -mavx512bf16, called only after
// cpu_has_avx512_bf16() said yes. The FMA loop (chains_avx512.hpp) with vdpbf16ps: each
// instruction is 16 lanes × 2 bf16 products + their sum into a float32 lane = 64 FLOP.
#include <immintrin.h>

#include "chains_avx512.hpp"
#include "peaks.hpp"

namespace attn::bench::detail {

float dpbf16_chains_avx512(long iters) {
    // Pairs (1.0, 1.0) and (2^-7, 2^-7): every chain grows by 2^-6 per step, so the values
    // stay finite for any iteration count a trial uses, and depend on every step.
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    return chains_avx512(iters, [=](__m512 a) { return _mm512_dpbf16_ps(a, x, y); });
}

}  // namespace attn::bench::detail
