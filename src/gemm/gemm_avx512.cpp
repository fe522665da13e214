// The AVX-512 row's GEMM micro-kernel (gemm_driver.hpp does the rest). Compiled with
// ATTN_AVX512_FLAGS; reached only through the kernel table's avx512 row.
//
// kMR rows × kNV·16 columns of accumulators: per k, kNV vector loads of packed B and kMR
// scalars of packed A, each broadcast from memory (`vbroadcastss`) into kNV FMAs.
// 6 × 64: 24 accumulators + 4 B vectors of the 32 zmm; 10 loads per 24 FMAs (12 × 32 took 14).
// Inside the driver on Sapphire Rapids (S6's projections, pre-packed weights, 1 thread) the load
// count is what sets the rate: 12 × 32 135–145 GFLOP/s, 14 × 32 147 (16 loads per 28 FMAs),
// 8 × 48 142–155 (11 per 24), 6 × 64 144–156, 9 × 48 146–153 (12 per 27); a software prefetch
// of B did not add to 6 × 64 (docs/kernels-lab.md, gemm-9). On Zen 5 at KC = 256, 8 × 48 and
// 14 × 32 were level with 12 × 32 (gemm-1). Every element is still one FMA chain over k in
// order: the tile shape does not change a bit of C.
#include <immintrin.h>

#include "../kernels/isa.hpp"
#define ATTN_GEMM_NS gemm_avx512_ns
#include "gemm_driver.hpp"
#include "gemm_store_avx512.hpp"

namespace attn::detail {
namespace gemm_avx512_ns {
namespace {

// dst[k·ldd + c] = src[c·lds + k] for c, k < 16: a 16 × 16 block of a row-major matrix,
// transposed in registers (the projections' op(B) = Wᵀ: 16 loads, 64 shuffles and 16 stores
// instead of 256 scalar loads and stores).
inline void transpose16(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: [a0 b0 a1 b1], [a2 b2 a3 b3]
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // r[4g + j], lane L: element 4L + j of rows 4g .. 4g+3
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {  // gather lane L of r[j], r[4+j], r[8+j], r[12+j]: dst row 4L + j
        const __m512 u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44), u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
        const __m512 u2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44), u3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
        _mm512_storeu_ps(dst + (0 + j) * ldd, _mm512_shuffle_f32x4(u0, u2, 0x88));
        _mm512_storeu_ps(dst + (4 + j) * ldd, _mm512_shuffle_f32x4(u0, u2, 0xDD));
        _mm512_storeu_ps(dst + (8 + j) * ldd, _mm512_shuffle_f32x4(u1, u3, 0x88));
        _mm512_storeu_ps(dst + (12 + j) * ldd, _mm512_shuffle_f32x4(u1, u3, 0xDD));
    }
}

template <int MR, int NV, int KC, int MC, int NC>
struct Micro {
    static constexpr std::int64_t kMR = MR, kNR = 16 * NV, kKC = KC, kMC = MC, kNC = NC;
    template <int R>
    using WithRows = Micro<R, NV, KC, MC, NC>;  // the few-row path (gemm_driver.hpp)
    static constexpr std::int64_t kTransposeBlock = 16;  // pack_b's Bᵀ copy (gemm_driver.hpp)
    static constexpr std::int64_t kLongABlocksBelowL2 = std::int64_t{2} << 20;  // cache_blocks (gemm_driver.hpp)
    static void transpose_block(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
        transpose16(src, lds, dst, ldd);
    }

    static void tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, float beta,
                     const float* bias) {
        __m512 acc[MR][NV];
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
        prefetch_c<MR, NV>(c, ldc);
#pragma GCC unroll 4
        for (std::int64_t k = 0; k < kc; ++k, a += MR, b += kNR) {
            __m512 bv[NV];
            for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
            for (int r = 0; r < MR; ++r) {
                const __m512 av = _mm512_set1_ps(a[r]);
                for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
            }
        }
        store_tile<MR, NV>(acc, c, ldc, beta, bias);
    }
};

// KC = 1024: S6's K = 768 is one chunk, so C is read and written once per element; the B
// slivers stream from L2 (a 768 × 64 one is 192 KiB: 4× an L1d of 48 KiB) beside the A block.
// Measured on Zen 5 with 12 × 32 (docs/kernels-lab.md, gemm-1): KC = 256 → 144–151 GFLOP/s per
// core, 768 → 159–179, 1024 → 171–181. On Sapphire Rapids (gemm-9) a shorter KC is no better
// (KC = 256 / 384, where a 12 × 32 sliver fits the L1d: +1–4 % on the QKV GEMM, −1–3 % on the
// out GEMM, C read and written 2–3 times), so KC stays a constant of the row.
using Avx512Micro = Micro<6, 4, 1024, 144, 4096>;

}  // namespace
}  // namespace gemm_avx512_ns

void gemm_avx512(const GemmArgs& g) { gemm_avx512_ns::gemm_driver<gemm_avx512_ns::Avx512Micro>(g); }
std::int64_t gemm_pack_b_avx512(const GemmArgs& g, float* dst) {
    return gemm_avx512_ns::gemm_pack_b_all<gemm_avx512_ns::Avx512Micro>(g, dst);
}

}  // namespace attn::detail
