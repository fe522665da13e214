#include "linear.hpp"

#include <cblas.h>

#include <omp.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attn/error.hpp"

namespace attn::detail {
namespace {

// OpenMP's thread count (ATTN_NUM_THREADS / OMP_NUM_THREADS) is attn's. OpenBLAS
// (pthreads build) has its own pool sized at load time, so the GEMMs follow OpenMP's count
// here — unless the user sized OpenBLAS explicitly with OPENBLAS_NUM_THREADS.
void match_blas_threads() {
#ifdef ATTN_HAVE_OPENBLAS_THREADS
    static const bool user_set = std::getenv("OPENBLAS_NUM_THREADS") != nullptr;
    if (user_set || omp_in_parallel()) return;
    const int want = omp_get_max_threads();
    if (openblas_get_num_threads() != want) openblas_set_num_threads(want);
#endif
}

}  // namespace

void linear(const float* x, std::int64_t N, std::int64_t K, std::int64_t ldx, const float* w, std::int64_t M,
            const float* bias, float* y, std::int64_t ldy) {
    // y: (N, M) = x: (N, K) · w: (M, K)ᵀ + bias
    for (std::int64_t v : {N, K, M, ldx, ldy}) {
        if (v > INT_MAX) throw Error("linear: size " + std::to_string(v) + " exceeds the BLAS's int range");
    }
    if (N == 0 || M == 0) return;
    float beta = 0.0f;
    if (bias != nullptr) {
        // The bias goes in first and the GEMM accumulates onto it (beta = 1): the BLAS
        // scales C by beta anyway, so this costs no extra pass over the output.
#pragma omp parallel for schedule(static)
        for (std::int64_t n = 0; n < N; ++n) std::memcpy(y + n * ldy, bias, static_cast<std::size_t>(M) * sizeof(float));
        beta = 1.0f;
    }
    if (K == 0) {
        if (bias == nullptr)
            for (std::int64_t n = 0; n < N; ++n) std::memset(y + n * ldy, 0, static_cast<std::size_t>(M) * sizeof(float));
        return;
    }
    match_blas_threads();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                1.0f, x, static_cast<int>(ldx), w, static_cast<int>(K), beta, y, static_cast<int>(ldy));
}

}  // namespace attn::detail
