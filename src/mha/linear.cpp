#include "linear.hpp"

#include <cstring>

#include "../gemm/gemm.hpp"

namespace attn::detail {

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    GemmArgs g;
    g.ta = ta;
    g.tb = tb;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.lda = lda;
    g.B = B;
    g.ldb = ldb;
    g.beta = beta;
    g.C = C;
    g.ldc = ldc;
    sgemm(g);
}

namespace {

// Points g's A (B) at the operand: float32 directly, 16-bit through A16 (B16).
GemmHalf half_of(DType dt) { return dt == DType::f16 ? GemmHalf::f16 : dt == DType::bf16 ? GemmHalf::bf16 : GemmHalf::none; }

}  // namespace

void linear(Operand x, std::int64_t N, std::int64_t K, std::int64_t ldx, Operand w, std::int64_t M,
            const float* bias, float* y, std::int64_t ldy, ColumnBlocks y_blocks, RowGroups x_groups) {
    // y: (N, M) = x: (N, K) · w: (M, K)ᵀ + bias
    if (N == 0 || M == 0) return;
    GemmArgs g;
    g.tb = true;
    g.M = N;
    g.N = M;
    g.K = K;
    g.lda = ldx;
    g.ldb = K;
    g.beta = 0.0f;
    g.bias = bias;  // in the GEMM's epilogue: no pass of its own over y, and y is never read
    g.C = y;
    g.ldc = ldy;
    g.c_block = y_blocks.width;
    g.c_block_stride = y_blocks.stride;
    g.a_group = x_groups.rows;
    g.a_group_stride = x_groups.stride;
    g.a16 = half_of(x.dtype);
    g.b16 = half_of(w.dtype);
    if (g.a16 == GemmHalf::none) g.A = static_cast<const float*>(x.data);
    else g.A16 = static_cast<const std::uint16_t*>(x.data);
    if (g.b16 == GemmHalf::none) g.B = static_cast<const float*>(w.data);
    else g.B16 = static_cast<const std::uint16_t*>(w.data);
    g.packed = w.packed;
    sgemm(g);
}

void sum_rows(const float* x, std::int64_t N, std::int64_t M, std::int64_t ld, float* acc, bool accumulate) {
    if (!accumulate) std::memset(acc, 0, static_cast<std::size_t>(M) * sizeof(float));
    for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t m = 0; m < M; ++m) acc[m] += x[n * ld + m];
}

}  // namespace attn::detail
