// The AVX-512 row of the kernel table's narrow16 (isa.hpp): half_avx512.hpp's narrow_row_avx512.
#include "../isa.hpp"
#include "half_avx512.hpp"

namespace attn::detail {

void narrow16_avx512(const float* x, std::uint16_t* y, std::size_t n, bool is_f16) {
    narrow_row_avx512(x, static_cast<std::int64_t>(n), is_f16, y);
}

}  // namespace attn::detail
