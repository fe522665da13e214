// The GEMMs of the MHA layer (projections forward, their gradients backward), on attn's own
// packed GEMM (src/gemm/gemm.hpp): the kernel table's row, OpenMP's thread count.
//
// Results do not depend on the thread count, by construction: every element of C is one FMA
// chain over K in chunks whose bounds depend on K only, and threads split C's rows or
// columns, never K (gemm/gemm_driver.hpp).
#pragma once

#include <cstdint>

namespace attn::detail {

// C (M, N) row stride ldc  =  op(A) · op(B)  +  beta · C, row-major; op(A) is (M, K),
// op(B) is (K, N); ta/tb transpose. beta = 0 does not read C.
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// y: (N, M) row stride ldy  =  x: (N, K) row stride ldx  ·  wᵀ,  w: (M, K) contiguous  (+ bias (M,) per row)
// This is torch.nn.functional.linear.
void linear(const float* x, std::int64_t N, std::int64_t K, std::int64_t ldx, const float* w, std::int64_t M,
            const float* bias, float* y, std::int64_t ldy);

// acc (M,) (+)= Σ over N rows of x (N, M) row stride ld: a bias gradient (accumulate = false
// overwrites acc).
void sum_rows(const float* x, std::int64_t N, std::int64_t M, std::int64_t ld, float* acc, bool accumulate);

}  // namespace attn::detail
