// The portable row of the kernel table's exp2 (isa.hpp).
#include "../isa.hpp"
#include "exp2.hpp"

namespace attn::detail {

void exp2_portable(const float* x, float* y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) y[i] = exp2poly::exp2_scalar(x[i]);
}

}  // namespace attn::detail
