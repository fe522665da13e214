// The AVX2 row's GEMM micro-kernel (gemm_driver.hpp does the rest). Compiled with
// ATTN_AVX2_FLAGS; reached only through the kernel table's avx2 row.
//
// 6 rows × 16 columns: 12 ymm accumulators + 2 B vectors (+ broadcasts) of the 16 ymm;
// per k, 2 vector loads of packed B and 6 broadcasts of packed A for 12 FMAs.
#include <immintrin.h>

#include "../kernels/isa.hpp"
#define ATTN_GEMM_NS gemm_avx2_ns
#include "gemm_driver.hpp"

namespace attn::detail {
namespace gemm_avx2_ns {
namespace {

template <int MR, int NV, int KC, int MC, int NC>
struct Micro {
    static constexpr std::int64_t kMR = MR, kNR = 8 * NV, kKC = KC, kMC = MC, kNC = NC;
    template <int R>
    using WithRows = Micro<R, NV, KC, MC, NC>;  // the few-row path (gemm_driver.hpp)

    static void tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, float beta,
                     const float* bias) {
        __m256 acc[MR][NV];
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
        // C's rows are needed only after the K loop; fetching them now hides their miss
        // (C of S6's QKV GEMM is 19 MB: from L3 or memory, once per K chunk).
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < kNR; v += 16) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + v), _MM_HINT_T0);
#pragma GCC unroll 4
        for (std::int64_t k = 0; k < kc; ++k, a += MR, b += kNR) {
            __m256 bv[NV];
            for (int v = 0; v < NV; ++v) bv[v] = _mm256_load_ps(b + 8 * v);
            for (int r = 0; r < MR; ++r) {
                const __m256 av = _mm256_broadcast_ss(a + r);
                for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
            }
        }
        if (bias != nullptr) {  // (beta = 0) sum + bias: the bits of C = bias, beta = 1
            for (int v = 0; v < NV; ++v) {
                const __m256 bv = _mm256_loadu_ps(bias + 8 * v);
                for (int r = 0; r < MR; ++r) _mm256_storeu_ps(c + r * ldc + 8 * v, _mm256_add_ps(acc[r][v], bv));
            }
        } else if (beta == 0.0f) {
            for (int r = 0; r < MR; ++r)
                for (int v = 0; v < NV; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
        } else {
            const __m256 bt = _mm256_set1_ps(beta);
            for (int r = 0; r < MR; ++r)
                for (int v = 0; v < NV; ++v) {
                    float* p = c + r * ldc + 8 * v;
                    _mm256_storeu_ps(p, _mm256_fmadd_ps(bt, _mm256_loadu_ps(p), acc[r][v]));
                }
        }
    }
};

// KC = 512: the KC × 16 B sliver is 32 KiB (Zen 3's whole L1d, Zen 5's 48 KiB), the 144 × 512 A block
// 288 KiB of a 512 KiB (Zen 3) L2. Measured on Zen 5 only (docs/kernels-lab.md, "The projection GEMM,
// measured"): KC = 256 → 79–88 GFLOP/s per core, 512 → 92–98, 768 → 87–98.
using Avx2Micro = Micro<6, 2, 512, 144, 4096>;

}  // namespace
}  // namespace gemm_avx2_ns

void gemm_avx2(const GemmArgs& g) { gemm_avx2_ns::gemm_driver<gemm_avx2_ns::Avx2Micro>(g); }
std::int64_t gemm_pack_b_avx2(const GemmArgs& g, float* dst) {
    return gemm_avx2_ns::gemm_pack_b_all<gemm_avx2_ns::Avx2Micro>(g, dst);
}

}  // namespace attn::detail
