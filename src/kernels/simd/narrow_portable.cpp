// The portable row of the kernel table's narrow16 (isa.hpp): attn/half.hpp's rounding, one value
// at a time (the bfloat16 loop without float_to_bf16's branch, so the compiler vectorises it).
#include <cstring>

#include "attn/half.hpp"
#include "../isa.hpp"

namespace attn::detail {

void narrow16_portable(const float* x, std::uint16_t* y, std::size_t n, bool is_f16) {
    if (is_f16) {
        for (std::size_t i = 0; i < n; ++i) y[i] = float_to_f16(x[i]);
        return;
    }
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, &x[i], 4);
        const std::uint32_t nan = (u >> 16) | 0x40u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        y[i] = static_cast<std::uint16_t>(static_cast<std::int32_t>(u & 0x7fffffffu) > 0x7f800000 ? nan : rounded);
    }
}

}  // namespace attn::detail
