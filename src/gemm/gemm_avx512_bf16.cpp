// The avx512 row's GEMM for bfloat16 A and B on a CPU with AVX-512 BF16: the micro-kernel
// multiplies pairs of k with vdpbf16ps (_mm512_dpbf16_ps: per float32 lane, two bf16 products
// added to the accumulator), twice the FMA's products per instruction; gemm_driver.hpp packs
// both operands as pair words (kPairs) and does the rest. This file alone carries
// ATTN_AVX512_BF16_FLAGS among the GEMM's; sgemm (gemm.cpp) calls it only for all-bf16 operands
// when cpu_features().has_avx512_bf16() (kernels/isa.hpp: bf16 compute is a member of the
// avx512 row).
//
// Arithmetic: a bf16 × bf16 product is exact in float32 (8 + 8 significant bits), so each
// element is still one chain of rounded additions over k in K-chunk order — two per pair
// instead of one FMA per k — and gemm.hpp's bound holds unchanged. What differs from the
// float32 micro-kernel on the widened values: the order inside a pair, and vdpbf16ps's
// denormal rule (bf16 inputs below 2^-126 count as 0, a denormal sum is flushed to 0).
#include <immintrin.h>

#include "../kernels/isa.hpp"
#define ATTN_GEMM_NS gemm_avx512_bf16_ns
#include "gemm_driver.hpp"
#include "gemm_store_avx512.hpp"

namespace attn::detail {
namespace gemm_avx512_bf16_ns {
namespace {

// A 12 × 32 register tile (24 accumulators + 2 B vectors; the float32 kernel's until it became
// 6 × 64, gemm_avx512.cpp — not re-measured here: on Sapphire Rapids bf16 runs on AMX), one
// step per pair of k: 2 loads of B pair vectors, 12 broadcast A pair words, 24 vdpbf16ps.
template <int MR, int NV, int KC, int MC, int NC>
struct PairMicro {
    static constexpr std::int64_t kMR = MR, kNR = 16 * NV, kKC = KC, kMC = MC, kNC = NC;
    static constexpr bool kPairs = true;  // gemm_driver.hpp packs pair words
    template <int R>
    using WithRows = PairMicro<R, NV, KC, MC, NC>;

    static void tile(std::int64_t kc, const float* a_panel, const float* b_panel, float* c, std::int64_t ldc, float beta,
                     const float* bias) {
        const auto* a = reinterpret_cast<const std::uint32_t*>(a_panel);
        const auto* b = reinterpret_cast<const std::uint32_t*>(b_panel);
        __m512 acc[MR][NV];
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
        prefetch_c<MR, NV>(c, ldc);
        const std::int64_t np = (kc + 1) / 2;
#pragma GCC unroll 4
        for (std::int64_t p = 0; p < np; ++p, a += MR, b += kNR) {
            __m512bh bv[NV];
            for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
            for (int r = 0; r < MR; ++r) {
                const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
                for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
            }
        }
        store_tile<MR, NV>(acc, c, ldc, beta, bias);
    }
};

// The float32 kernel's blocks: a KC-deep chunk of pairs is half its bytes, so the same KC keeps
// the same K chunks (S6's K = 768: one) with room to spare in L1 and L2.
using Avx512Bf16Micro = PairMicro<12, 2, 1024, 144, 4096>;

}  // namespace
}  // namespace gemm_avx512_bf16_ns

void gemm_avx512_bf16(const GemmArgs& g) { gemm_avx512_bf16_ns::gemm_driver<gemm_avx512_bf16_ns::Avx512Bf16Micro>(g); }
std::int64_t gemm_pack_b_avx512_bf16(const GemmArgs& g, float* dst) {
    return gemm_avx512_bf16_ns::gemm_pack_b_all<gemm_avx512_bf16_ns::Avx512Bf16Micro>(g, dst);
}

}  // namespace attn::detail
