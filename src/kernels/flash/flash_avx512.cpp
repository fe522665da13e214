// The AVX-512 flash path. This file alone (of the flash kernel) is compiled with
// ATTN_AVX512_FLAGS (src/CMakeLists.txt: ATTN_AVX512_SOURCES); it is reached only through
// the kernel table (isa.cpp), whose avx512 row is used only on a CPU that has AVX-512
// F+VL+BW+DQ with OS-saved ZMM state.
//
// Micro-kernels: 8 rows × 32 queries — a 32-query panel is 2 zmm, so each row has two
// accumulators: 16 accumulators + the 2 panel vectors of 32 zmm; per inner step 2 vector loads
// and 16 FMAs whose K/V operand is one scalar per row, broadcast straight from memory (the
// {1to16} embedded-broadcast form: no shuffle uop, no broadcast register), each used twice.
// Measured hot in L1 on Zen 5 (docs/kernels.md): 16 rows × 1 zmm (16 queries, the first
// version) ran at 52–59 % of the register-only FMA loop, 32 queries × 8/12/14 rows at 61–65 %:
// half the broadcasts per FMA. 8 rows divide the usual head dims (64, 128) and the 64-key
// block, so pv has no ragged tile; 12 or 14 rows measured the same and would leave one.
#include <immintrin.h>

#define ATTN_FLASH_NS flash_avx512_ns
#include "../simd/exp2_avx512.hpp"
#include "flash_driver.hpp"
#include "../simd/half_avx512.hpp"

namespace attn::detail {
namespace flash_avx512_ns {
namespace {

// Accumulators are named variables, not arrays (GCC kept arrays of vectors on the stack in
// the AVX2 kernel: a store per FMA).
#define ATTN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

// s[r][0..32) = c2 · Σ_d k[r][d]·qt[d][0..32)   for r < R     k: (R, ldk), qt: (Dk, 32)
template <int R>
inline void qk_tile(const float* qt, const float* k, std::int64_t ldk, int Dk, float c2, float* s, int ldS) {
#define DECL(r) __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = _mm512_setzero_ps();
    ATTN_ROWS(DECL)
#undef DECL
    for (int d = 0; d < Dk; ++d) {
        const __m512 q0 = _mm512_load_ps(qt + d * 32), q1 = _mm512_load_ps(qt + d * 32 + 16);
        const float* kd = k + d;
#define STEP(r)                                               \
    if constexpr (R > r) {                                    \
        const __m512 kb = _mm512_set1_ps(kd[r * ldk]);        \
        a##r##0 = _mm512_fmadd_ps(kb, q0, a##r##0);           \
        a##r##1 = _mm512_fmadd_ps(kb, q1, a##r##1);           \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
    const __m512 vc = _mm512_set1_ps(c2);
#define STORE(r)                                                          \
    if constexpr (R > r) {                                                \
        _mm512_store_ps(s + r * ldS, _mm512_mul_ps(a##r##0, vc));         \
        _mm512_store_ps(s + r * ldS + 16, _mm512_mul_ps(a##r##1, vc));    \
    }
    ATTN_ROWS(STORE)
#undef STORE
}

// ot[r][0..32) = alpha·ot[r] + Σ_j v[j][r]·p[j][0..32)   for r < R   v: (nk, ldv), p: (nk, ldP)
template <int R>
inline void pv_tile(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, float* ot, int ldO,
                    const float* alpha) {
    const __m512 al0 = _mm512_load_ps(alpha), al1 = _mm512_load_ps(alpha + 16);
#define DECL(r)                                                                   \
    __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = _mm512_setzero_ps();          \
    if constexpr (R > r) {                                                        \
        a##r##0 = _mm512_mul_ps(_mm512_load_ps(ot + r * ldO), al0);               \
        a##r##1 = _mm512_mul_ps(_mm512_load_ps(ot + r * ldO + 16), al1);          \
    }
    ATTN_ROWS(DECL)
#undef DECL
    for (int j = 0; j < nk; ++j) {
        const __m512 p0 = _mm512_load_ps(p + j * ldP), p1 = _mm512_load_ps(p + j * ldP + 16);
        const float* vj = v + j * ldv;
#define STEP(r)                                               \
    if constexpr (R > r) {                                    \
        const __m512 vb = _mm512_set1_ps(vj[r]);              \
        a##r##0 = _mm512_fmadd_ps(vb, p0, a##r##0);           \
        a##r##1 = _mm512_fmadd_ps(vb, p1, a##r##1);           \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
#define STORE(r)                                              \
    if constexpr (R > r) {                                    \
        _mm512_store_ps(ot + r * ldO, a##r##0);               \
        _mm512_store_ps(ot + r * ldO + 16, a##r##1);          \
    }
    ATTN_ROWS(STORE)
#undef STORE
}
#undef ATTN_ROWS

#define ATTN_CASES(X) X(8) X(7) X(6) X(5) X(4) X(3) X(2)

struct Avx512Ops {
    static constexpr int kPanel = 32;  // queries per panel: 2 zmm
    static constexpr int kRows = 8;    // keys (qk) / head-dim rows (pv) per call: the 8 × 32 tile

    static void qk(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s, int ldS) {
        switch (rows) {
#define CASE(n) \
    case n: qk_tile<n>(qt, k, ldk, Dk, c2, s, ldS); break;
            ATTN_CASES(CASE)
#undef CASE
            default: qk_tile<1>(qt, k, ldk, Dk, c2, s, ldS); break;
        }
    }

    static void pv(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int rows, float* ot, int ldO,
                   const float* alpha) {
        switch (rows) {
#define CASE(n) \
    case n: pv_tile<n>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
            ATTN_CASES(CASE)
#undef CASE
            default: pv_tile<1>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
        }
    }

    // Online-softmax update, 16 query columns (one zmm) at a time, vertical over the nk keys.
    static void softmax(float* s, int ldS, int nk, int ncols, float* m, float* l, float* alpha) {
        const __m512 ninf = _mm512_set1_ps(kNegInf), l2e = _mm512_set1_ps(kLog2e);
        for (int c = 0; c < ncols; c += 16) {
            const __m512 mold = _mm512_load_ps(m + c);
            // Four independent max chains and two sum chains (latency, as in the AVX2 path).
            __m512 x0 = mold, x1 = mold, x2 = mold, x3 = mold;
            int j = 0;
            for (; j + 4 <= nk; j += 4) {
                x0 = _mm512_max_ps(x0, _mm512_load_ps(s + (j + 0) * ldS + c));
                x1 = _mm512_max_ps(x1, _mm512_load_ps(s + (j + 1) * ldS + c));
                x2 = _mm512_max_ps(x2, _mm512_load_ps(s + (j + 2) * ldS + c));
                x3 = _mm512_max_ps(x3, _mm512_load_ps(s + (j + 3) * ldS + c));
            }
            for (; j < nk; ++j) x0 = _mm512_max_ps(x0, _mm512_load_ps(s + j * ldS + c));
            const __m512 mx = _mm512_max_ps(_mm512_max_ps(x0, x1), _mm512_max_ps(x2, x3));
            // A column with nothing visible yet keeps m = −inf; subtract 0 there so that
            // 2^(−inf − 0) = 0 instead of 2^(−inf + inf) = NaN (NaN compares unequal: kept).
            const __m512 use = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mx, ninf, _CMP_NEQ_UQ), mx);
            // Natural-unit scores: 2^((s − max)·log2 e) (flash_driver.hpp says why).
            const __m512 al = exp2_ps512(_mm512_mul_ps(_mm512_sub_ps(mold, use), l2e));
            __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
            j = 0;
            for (; j + 2 <= nk; j += 2) {
                float* s0 = s + j * ldS + c;
                float* s1 = s0 + ldS;
                const __m512 e0 = exp2_ps512(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(s0), use), l2e));
                const __m512 e1 = exp2_ps512(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(s1), use), l2e));
                _mm512_store_ps(s0, e0);
                _mm512_store_ps(s1, e1);
                sum0 = _mm512_add_ps(sum0, e0);
                sum1 = _mm512_add_ps(sum1, e1);
            }
            if (j < nk) {
                float* sj = s + j * ldS + c;
                const __m512 e = exp2_ps512(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(sj), use), l2e));
                _mm512_store_ps(sj, e);
                sum0 = _mm512_add_ps(sum0, e);
            }
            sum0 = _mm512_add_ps(sum0, sum1);
            _mm512_store_ps(alpha + c, al);
            _mm512_store_ps(l + c, _mm512_fmadd_ps(_mm512_load_ps(l + c), al, sum0));
            _mm512_store_ps(m + c, mx);
        }
    }

    // n float16/bfloat16 values (element stride `stride`) → float32: simd/half_*.hpp, the
    // loaders the decode kernel of this ISA uses too.
    static void widen(const std::uint16_t* src, std::int64_t stride, std::int64_t n, bool is_f16, float* dst) {
        widen_row_avx512(src, stride, n, is_f16, dst);
    }

    // Dropout factors of a row segment: the AVX2 Philox (isa.cpp's avx512 row says why).
    static void dropout_row(const DropoutRowArgs& a) { dropout_row_avx2(a); }

    static void weights_exp(float* s, int ldS, int nk, int ncols, const float* m, const float* lse2) {
        const __m512 l2e = _mm512_set1_ps(kLog2e);
        for (int c = 0; c < ncols; c += 16) {
            const __m512 mv = _mm512_load_ps(m + c), lv = _mm512_load_ps(lse2 + c);
            for (int j = 0; j < nk; ++j) {
                float* sj = s + j * ldS + c;
                // 2^((s − m)·log2 e − log2 l)
                _mm512_store_ps(sj, exp2_ps512(_mm512_fmsub_ps(_mm512_sub_ps(_mm512_load_ps(sj), mv), l2e, lv)));
            }
        }
    }
};
#undef ATTN_CASES

}  // namespace
}  // namespace flash_avx512_ns

void flash_forward_avx512(const SdpaProblem& p, const FlashTiles& tiles, const Dropout& drop, int threads) {
    flash_avx512_ns::run_flash<flash_avx512_ns::Avx512Ops>(p, tiles, drop, threads);
}

}  // namespace attn::detail
