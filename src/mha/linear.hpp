// The projection GEMM of the MHA layer, through CBLAS (any CBLAS links: OpenBLAS by
// default, see src/CMakeLists.txt).
#pragma once

#include <cstdint>

namespace attn::detail {

// y: (N, M) row stride ldy  =  x: (N, K) row stride ldx  ·  wᵀ,  w: (M, K) contiguous  (+ bias (M,) per row)
// This is torch.nn.functional.linear. Throws attn::Error if a size exceeds the BLAS's int.
void linear(const float* x, std::int64_t N, std::int64_t K, std::int64_t ldx, const float* w, std::int64_t M,
            const float* bias, float* y, std::int64_t ldy);

}  // namespace attn::detail
