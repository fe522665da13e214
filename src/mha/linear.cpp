#include "linear.hpp"

#include <cblas.h>

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "../core/check.hpp"

namespace attn::detail {
namespace {

// Each block must be one single-threaded BLAS call. OpenBLAS's pthreads build keeps its own
// pool, used by every call unless its count is 1: the guard sets it to 1 for the blocks
// (attn's parallelism is OpenMP's, over the blocks) and gives the program its own count back
// afterwards, so a caller's BLAS calls outside attn keep their threads. OpenBLAS's OpenMP
// build (openblas_get_parallel() == 2) already runs single-threaded inside a parallel region,
// and its setter would change OpenMP's count, so it is left alone; so are sequential builds
// (0) and other BLASes (MKL runs sequentially in a parallel region; BLIS is single-threaded
// unless asked).
class SingleThreadedBlas {
public:
    SingleThreadedBlas() {
#ifdef ATTN_HAVE_OPENBLAS_THREADS
        if (openblas_get_parallel() == 1) {
            saved_ = openblas_get_num_threads();
            if (saved_ != 1) openblas_set_num_threads(1);
        }
#endif
    }
    ~SingleThreadedBlas() {
#ifdef ATTN_HAVE_OPENBLAS_THREADS
        if (saved_ > 1) openblas_set_num_threads(saved_);
#endif
    }
    SingleThreadedBlas(const SingleThreadedBlas&) = delete;
    SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

private:
    int saved_ = 0;
};

int blas_int(std::int64_t v) {
    if (v > INT_MAX) fail("MultiHeadAttention", "GEMM size ", v, " exceeds the BLAS's int range (", INT_MAX, ")");
    return static_cast<int>(v);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

GemmBlocks gemm_blocks(std::int64_t M, std::int64_t N) {
    // Each row block repacks B (N·K floats) and each column block repacks A (M·K), so blocks
    // are large: at most 512 rows (the weights of S6's QKV GEMM, 2304×768, are repacked 4×
    // for its 2048 rows) and 1024 columns (a decode step's few rows still give the QKV GEMM
    // 3 blocks to share). Cuts are even, so the blocks of a split run equally long.
    // Measured on S6's projections against one multi-threaded call: equal within the noise
    // of a shared machine (bench/mha/README.md).
    constexpr std::int64_t kRows = 512, kCols = 1024;
    return GemmBlocks{ceil_div(M, ceil_div(M, kRows)), ceil_div(N, ceil_div(N, kCols))};
}

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    for (std::int64_t v : {M, N, K, lda, ldb, ldc}) blas_int(v);
    if (M == 0 || N == 0) return;
    if (K == 0) {  // op(A)·op(B) = 0: C = beta·C, without reading A or B
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    const SingleThreadedBlas one_thread;
    const GemmBlocks bs = gemm_blocks(M, N);
    const std::int64_t nr = ceil_div(M, bs.rows), nc = ceil_div(N, bs.cols);
#pragma omp parallel for schedule(static)
    for (std::int64_t blk = 0; blk < nr * nc; ++blk) {
        const std::int64_t r0 = (blk / nc) * bs.rows, c0 = (blk % nc) * bs.cols;
        const std::int64_t m = std::min(bs.rows, M - r0), n = std::min(bs.cols, N - c0);
        // Rows r0.. of op(A): rows of A, or its columns when transposed; likewise columns of op(B).
        const float* a = ta ? A + r0 : A + r0 * lda;
        const float* b = tb ? B + c0 * ldb : B + c0;
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                    static_cast<int>(n), static_cast<int>(K), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                    beta, C + r0 * ldc + c0, static_cast<int>(ldc));
    }
}

void linear(const float* x, std::int64_t N, std::int64_t K, std::int64_t ldx, const float* w, std::int64_t M,
            const float* bias, float* y, std::int64_t ldy) {
    // y: (N, M) = x: (N, K) · w: (M, K)ᵀ + bias
    if (N == 0 || M == 0) return;
    float beta = 0.0f;
    if (bias != nullptr) {
        // The bias goes in first and the GEMM accumulates onto it (beta = 1): the BLAS
        // scales C by beta anyway, so this costs no extra pass over the output.
#pragma omp parallel for schedule(static)
        for (std::int64_t n = 0; n < N; ++n) std::memcpy(y + n * ldy, bias, static_cast<std::size_t>(M) * sizeof(float));
        beta = 1.0f;
    }
    gemm(false, true, N, M, K, x, ldx, w, K, beta, y, ldy);
}

}  // namespace attn::detail
