// The GEMMs of the MHA layer (projections forward, their gradients backward), through
// CBLAS (any CBLAS links: OpenBLAS by default, see src/CMakeLists.txt).
//
// Results do not depend on the thread count, by construction: C is cut into blocks whose
// boundaries depend only on the shape (gemm_blocks), each block is one single-threaded
// cblas_sgemm call over the whole reduction dimension, and OpenMP runs the blocks. So every
// element is computed by the same call, with the same operands, whatever the thread count —
// a BLAS's own threading does not promise that (OpenBLAS 0.3.21 picks other kernel splits
// on 1 and 2 threads on AMD Zen).
#pragma once

#include <cstdint>

namespace attn::detail {

// C (M, N) row stride ldc  =  op(A) · op(B)  +  beta · C, row-major; op(A) is (M, K),
// op(B) is (K, N); ta/tb transpose. Throws attn::Error if a size exceeds the BLAS's int.
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// y: (N, M) row stride ldy  =  x: (N, K) row stride ldx  ·  wᵀ,  w: (M, K) contiguous  (+ bias (M,) per row)
// This is torch.nn.functional.linear.
void linear(const float* x, std::int64_t N, std::int64_t K, std::int64_t ldx, const float* w, std::int64_t M,
            const float* bias, float* y, std::int64_t ldy);

// The block size gemm uses for C (M, N): a function of the shape only (exposed for tests).
struct GemmBlocks {
    std::int64_t rows = 0, cols = 0;
};
GemmBlocks gemm_blocks(std::int64_t M, std::int64_t N);

}  // namespace attn::detail
