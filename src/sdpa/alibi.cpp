// attn::alibi_slopes — the standard ALiBi slopes (Press et al., "Train Short, Test Long",
// and the reference implementation's get_slopes): a geometric sequence starting at
// 2^(−8/n) with ratio 2^(−8/n) for n a power of two; for other head counts the slopes of
// the largest power of two n' below, then every other slope of 2n'.
#include <cmath>
#include <cstdint>

#include "attn/sdpa.hpp"
#include "../core/check.hpp"

namespace attn {

Tensor alibi_slopes(std::int64_t heads) {
    if (heads < 1) detail::fail("alibi_slopes", "heads: must be >= 1 but got ", heads);
    if (heads > (std::int64_t{1} << 20)) detail::fail("alibi_slopes", "heads: must be <= 2^20 but got ", heads);
    std::int64_t n = 1;  // largest power of two <= heads
    while (n * 2 <= heads) n *= 2;
    Tensor t(DType::f32, Shape{heads});
    float* s = t.data_as<float>();
    for (std::int64_t h = 0; h < n; ++h) s[h] = static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n)));
    // get_slopes(2n)[0::2]: 2^(−8(2k+1)/(2n)) = 2^(−4(2k+1)/n)
    for (std::int64_t k = 0; n + k < heads; ++k)
        s[n + k] = static_cast<float>(std::exp2(-4.0 * static_cast<double>(2 * k + 1) / static_cast<double>(n)));
    return t;
}

}  // namespace attn
