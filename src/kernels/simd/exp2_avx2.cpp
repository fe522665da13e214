// The AVX2 row of the kernel table's exp2 (isa.hpp), for tests and callers outside a kernel.
#include "../isa.hpp"
#include "exp2_avx2.hpp"

namespace attn::detail {

void exp2_avx2(const float* x, float* y, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp2_ps(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float in[8] = {}, out[8];
        for (std::size_t t = 0; i + t < n; ++t) in[t] = x[i + t];
        _mm256_storeu_ps(out, exp2_ps(_mm256_loadu_ps(in)));
        for (std::size_t t = 0; i + t < n; ++t) y[i + t] = out[t];
    }
}

}  // namespace attn::detail
