// OpenBLAS for the bench's yardstick rows (qkv_blas, square_blas), loaded with dlopen on first
// use rather than linked: a linked OpenBLAS starts its thread pool when the `attn` executable
// loads, so every `attn sdpa` paid for a pool it never used (and under `ulimit -v` below
// ~150 MB a pool thread could not get its buffer and the process never exited).
#pragma once

#include <string>

namespace attn::bench {

// cblas_sgemm with row-major operands, op(A) (M, K) · op(B) (K, N) → C (M, N), C = A·B
// (alpha 1, beta 0), on `threads` OpenBLAS threads. Throws std::runtime_error naming the
// library when OpenBLAS cannot be loaded.
void openblas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                    int ldb, float* C, int ldc, int threads);

// Empty when OpenBLAS can be loaded, else why not (dlerror's text): the rows say so and skip.
std::string openblas_unavailable();

}  // namespace attn::bench
