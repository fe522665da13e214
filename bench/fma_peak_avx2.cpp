// FMA peak: independent chains of 256-bit FMAs, enough to cover latency × ports
// (Zen 3: 4 cycles × 2 ports → ≥ 8 chains; 12 used). Compiled with -mavx2 -mfma and
// called only after a CPU check.
#include <immintrin.h>

namespace attn::bench {

// Returns a value depending on every lane so the loop cannot be removed; n iterations
// perform n × 12 × 8 × 2 FLOPs.
float fma_chains_avx2(long n) {
    __m256 a[12];
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
    const __m256 m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
    for (long k = 0; k < n; ++k)
        for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
    __m256 s = a[0];
    for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

}  // namespace attn::bench
