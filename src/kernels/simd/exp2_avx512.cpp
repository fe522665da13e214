// The AVX-512 row of the kernel table's exp2 (isa.hpp), for tests and callers outside a kernel.
#include "../isa.hpp"
#include "exp2_avx512.hpp"

namespace attn::detail {

void exp2_avx512(const float* x, float* y, std::size_t n) {
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp2_ps512(_mm512_loadu_ps(x + i)));
    if (i < n) {  // the tail under a mask: no read or write past n
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, exp2_ps512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

}  // namespace attn::detail
