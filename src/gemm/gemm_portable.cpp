// The portable row's GEMM micro-kernel (gemm_driver.hpp does the rest): plain C++, 4 × 16,
// which the compiler vectorises with the baseline ISA (SSE2 on x86-64); multiply and add, not
// std::fma, which is a library call without FMA hardware.
#define ATTN_GEMM_NS gemm_portable_ns
#include "../kernels/isa.hpp"
#include "gemm_driver.hpp"

namespace attn::detail {
namespace gemm_portable_ns {
namespace {

template <int MR>
struct Micro {
    static constexpr std::int64_t kMR = MR, kNR = 16, kKC = 256, kMC = 128, kNC = 4096;
    template <int R>
    using WithRows = Micro<R>;  // the few-row path (gemm_driver.hpp)

    static void tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, float beta,
                     const float* bias) {
        float acc[kMR][kNR] = {};
        for (std::int64_t k = 0; k < kc; ++k, a += kMR, b += kNR)
            for (int r = 0; r < kMR; ++r)
                for (int j = 0; j < kNR; ++j) acc[r][j] += a[r] * b[j];
        for (int r = 0; r < kMR; ++r)
            for (int j = 0; j < kNR; ++j) {
                float& out = c[r * ldc + j];
                // (a bias comes with beta = 0: sum + bias, the bits of C = bias, beta = 1)
                out = bias != nullptr ? acc[r][j] + bias[j] : beta == 0.0f ? acc[r][j] : beta * out + acc[r][j];
            }
    }
};

}  // namespace
}  // namespace gemm_portable_ns

void gemm_portable(const GemmArgs& g) { gemm_portable_ns::gemm_driver<gemm_portable_ns::Micro<4>>(g); }
std::int64_t gemm_pack_b_portable(const GemmArgs& g, float* dst) {
    return gemm_portable_ns::gemm_pack_b_all<gemm_portable_ns::Micro<4>>(g, dst);
}

}  // namespace attn::detail
