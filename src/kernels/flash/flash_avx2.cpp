// The AVX2 + FMA flash path. This file alone is compiled with -mavx2 -mfma -mf16c
// (src/CMakeLists.txt: ATTN_AVX2_SOURCES); it is reached only through the kernel table
// (isa.cpp), whose AVX2 row is used only on a CPU that has them. Micro-kernels: 6 rows × 16 queries of ymm accumulators (see flash_driver.hpp).
#include <immintrin.h>

#define ATTN_FLASH_NS flash_avx2_ns
#include "../simd/exp2_avx2.hpp"
#include "flash_driver.hpp"
#include "../simd/half_avx2.hpp"
#include "../simd/rounded.hpp"

namespace attn::detail {
namespace flash_avx2_ns {
namespace {

// Accumulators are named variables, not arrays: GCC kept arrays of __m256 on the stack
// (a store per FMA pair; v1 of the lab ran at 36 GFLOP/s on S2 because of it).
#define ATTN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

constexpr int kPanel = kFlashPanelAvx2;  // queries per panel: 2 ymm (Avx2Ops::kPanel)

// s[r][0..16) = c2 · Σ_d k[r][d]·qt[d][0..16)   for r < R     k: (R, ldk), qt: (Dk, 16)
template <int R>
inline void qk_tile(const float* qt, const float* k, std::int64_t ldk, int Dk, float c2, float* s, int ldS) {
#define DECL(r)                                                      \
    __m256 a##r##0 = _mm256_setzero_ps(), a##r##1 = _mm256_setzero_ps(); \
    const float* k##r = k + (R > r ? r : 0) * ldk;
    ATTN_ROWS(DECL)
#undef DECL
    for (int d = 0; d < Dk; ++d) {
        const __m256 q0 = _mm256_load_ps(qt + d * kPanel);
        const __m256 q1 = _mm256_load_ps(qt + d * kPanel + 8);
#define STEP(r)                                              \
    if constexpr (R > r) {                                   \
        const __m256 kb = _mm256_broadcast_ss(k##r + d);     \
        a##r##0 = _mm256_fmadd_ps(kb, q0, a##r##0);          \
        a##r##1 = _mm256_fmadd_ps(kb, q1, a##r##1);          \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
    const __m256 vc = _mm256_set1_ps(c2);
#define STORE(r)                                                       \
    if constexpr (R > r) {                                             \
        _mm256_store_ps(s + r * ldS, _mm256_mul_ps(a##r##0, vc));      \
        _mm256_store_ps(s + r * ldS + 8, _mm256_mul_ps(a##r##1, vc));  \
    }
    ATTN_ROWS(STORE)
#undef STORE
}

// ot[r][0..16) = alpha·ot[r] + Σ_j v[j][r]·p[j][0..16)   for r < R   v: (nk, ldv), p: (nk, ldP)
// A (rescale): multiply the loaded Oᵀ by alpha; false where every α is 1 (alpha = nullptr).
template <int R, bool A = true>
inline void pv_tile(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, float* ot, int ldO,
                    const float* alpha) {
    [[maybe_unused]] __m256 al0 = _mm256_set1_ps(1.0f), al1 = al0;
    if constexpr (A) {
        al0 = _mm256_load_ps(alpha);
        al1 = _mm256_load_ps(alpha + 8);
    }
    auto start = [&](const float* o, __m256 al) __attribute__((always_inline)) {
        if constexpr (A) return _mm256_mul_ps(_mm256_load_ps(o), al);
        else return _mm256_load_ps(o);
    };
#define DECL(r)                                                                               \
    __m256 a##r##0 = _mm256_setzero_ps(), a##r##1 = _mm256_setzero_ps();                      \
    if constexpr (R > r) {                                                                    \
        a##r##0 = start(ot + r * ldO, al0);                                                   \
        a##r##1 = start(ot + r * ldO + 8, al1);                                               \
    }
    ATTN_ROWS(DECL)
#undef DECL
    for (int j = 0; j < nk; ++j) {
        const __m256 p0 = _mm256_load_ps(p + j * ldP);
        const __m256 p1 = _mm256_load_ps(p + j * ldP + 8);
        const float* vj = v + j * ldv;
#define STEP(r)                                              \
    if constexpr (R > r) {                                   \
        const __m256 vb = _mm256_broadcast_ss(vj + r);       \
        a##r##0 = _mm256_fmadd_ps(vb, p0, a##r##0);          \
        a##r##1 = _mm256_fmadd_ps(vb, p1, a##r##1);          \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
#define STORE(r)                                        \
    if constexpr (R > r) {                              \
        _mm256_store_ps(ot + r * ldO, a##r##0);         \
        _mm256_store_ps(ot + r * ldO + 8, a##r##1);     \
    }
    ATTN_ROWS(STORE)
#undef STORE
}
#undef ATTN_ROWS

struct Avx2Ops {
    static constexpr int kPanel = flash_avx2_ns::kPanel;  // queries per panel: 2 ymm
    static constexpr int kRows = 6;  // keys (qk) / head-dim rows (pv) per call: the 6 × 16 tile
    static void qk(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s, int ldS) {
        switch (rows) {
            case 6: qk_tile<6>(qt, k, ldk, Dk, c2, s, ldS); break;
            case 5: qk_tile<5>(qt, k, ldk, Dk, c2, s, ldS); break;
            case 4: qk_tile<4>(qt, k, ldk, Dk, c2, s, ldS); break;
            case 3: qk_tile<3>(qt, k, ldk, Dk, c2, s, ldS); break;
            case 2: qk_tile<2>(qt, k, ldk, Dk, c2, s, ldS); break;
            default: qk_tile<1>(qt, k, ldk, Dk, c2, s, ldS); break;
        }
    }

    // alpha = nullptr: every α is 1 (the driver's pv_tile checked; no multiply).
    static void pv(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int rows, float* ot, int ldO,
                   const float* alpha) {
        if (alpha == nullptr) pv_rows<false>(p, ldP, v, ldv, nk, rows, ot, ldO, alpha);
        else pv_rows<true>(p, ldP, v, ldv, nk, rows, ot, ldO, alpha);
    }
    template <bool A>
    static void pv_rows(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int rows, float* ot, int ldO,
                        const float* alpha) {
        switch (rows) {
            case 6: pv_tile<6, A>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
            case 5: pv_tile<5, A>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
            case 4: pv_tile<4, A>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
            case 3: pv_tile<3, A>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
            case 2: pv_tile<2, A>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
            default: pv_tile<1, A>(p, ldP, v, ldv, nk, ot, ldO, alpha); break;
        }
    }

    // Online-softmax update, 8 query columns at a time (vertical over the nk keys).
    static void softmax(float* s, int ldS, int nk, int ncols, float* m, float* l, float* alpha) {
        const __m256 ninf = _mm256_set1_ps(kNegInf), l2e = _mm256_set1_ps(kLog2e);
        for (int c = 0; c < ncols; c += 8) {
            const __m256 mold = _mm256_load_ps(m + c);
            // Four independent max chains and two sum chains: one chain would wait on the
            // 4-cycle latency of every max/add (v1: the max loop alone took 6 % of the time).
            __m256 x0 = mold, x1 = mold, x2 = mold, x3 = mold;
            int j = 0;
            for (; j + 4 <= nk; j += 4) {
                x0 = _mm256_max_ps(x0, _mm256_load_ps(s + (j + 0) * ldS + c));
                x1 = _mm256_max_ps(x1, _mm256_load_ps(s + (j + 1) * ldS + c));
                x2 = _mm256_max_ps(x2, _mm256_load_ps(s + (j + 2) * ldS + c));
                x3 = _mm256_max_ps(x3, _mm256_load_ps(s + (j + 3) * ldS + c));
            }
            for (; j < nk; ++j) x0 = _mm256_max_ps(x0, _mm256_load_ps(s + j * ldS + c));
            const __m256 mx = _mm256_max_ps(_mm256_max_ps(x0, x1), _mm256_max_ps(x2, x3));
            // A column with nothing visible yet keeps m = −inf; subtract 0 there so that
            // 2^(−inf − 0) = 0 instead of 2^(−inf + inf) = NaN.
            const __m256 use = _mm256_andnot_ps(_mm256_cmp_ps(mx, ninf, _CMP_EQ_OQ), mx);
            // Natural-unit scores, base-2 exponents (flash_driver.hpp says why): s·log2 e − U as one
            // FMA where every |use| of the 8 columns is below kFusedExponentBelow, else (s − use)·log2 e
            // (flash_avx512.cpp's softmax says why, and what the fused form does to the bits).
            const __m256 below = _mm256_set1_ps(kFusedExponentBelow);
            const bool fused =
                _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), use), below, _CMP_NLT_UQ)) == 0;
            const __m256 u = fused ? _mm256_mul_ps(use, l2e) : use;
            // U_old rounded on its own (simd/rounded.hpp): GCC fused it with the subtract, α ≠ 1 at an unchanged max.
            const __m256 al = exp2_ps(fused ? _mm256_sub_ps(rounded(_mm256_mul_ps(mold, l2e)), u)
                                            : _mm256_mul_ps(_mm256_sub_ps(mold, u), l2e));
            const __m256 sum0 =
                fused ? exp_column(s + c, ldS, nk, [&](__m256 x) { return _mm256_fmsub_ps(x, l2e, u); })
                      : exp_column(s + c, ldS, nk, [&](__m256 x) { return _mm256_mul_ps(_mm256_sub_ps(x, u), l2e); });
            _mm256_store_ps(alpha + c, al);
            _mm256_store_ps(l + c, _mm256_fmadd_ps(_mm256_load_ps(l + c), al, sum0));
            _mm256_store_ps(m + c, mx);
        }
    }

    // s[j][0..8) ← 2^exponent(s[j][0..8)) for j < nk; returns their column sums (two chains: the
    // add's latency).
    template <class Exponent>
    __attribute__((always_inline)) static __m256 exp_column(float* s, int ldS, int nk, Exponent exponent) {
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 2 <= nk; j += 2) {
            float* s0 = s + j * ldS;
            float* s1 = s0 + ldS;
            const __m256 e0 = exp2_ps(exponent(_mm256_load_ps(s0)));
            const __m256 e1 = exp2_ps(exponent(_mm256_load_ps(s1)));
            _mm256_store_ps(s0, e0);
            _mm256_store_ps(s1, e1);
            sum0 = _mm256_add_ps(sum0, e0);
            sum1 = _mm256_add_ps(sum1, e1);
        }
        if (j < nk) {
            float* sj = s + j * ldS;
            const __m256 e = exp2_ps(exponent(_mm256_load_ps(sj)));
            _mm256_store_ps(sj, e);
            sum0 = _mm256_add_ps(sum0, e);
        }
        return _mm256_add_ps(sum0, sum1);
    }

    // 16 × 16 transpose (the driver's per-task Qᵀ pack and O store, flash_operands.hpp "Per-task
    // work"): out[r][c] = in[c][r] · scale[r] (scale null: a copy, bit for bit), as four 8 × 8
    // ymm transposes — 32-bit then 64-bit interleaves inside 128-bit lanes, then lane swaps.
    static void transpose16(const float* const* in, float* const* out, const float* scale) {
        for (int cb = 0; cb < 16; cb += 8) {      // input rows cb.. → output columns cb..
            for (int rb = 0; rb < 16; rb += 8) {  // input columns rb.. → output rows rb..
                __m256 r[8], t[8];
                for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in[cb + i] + rb);
                for (int i = 0; i < 8; i += 2) {
                    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
                }
                for (int i = 0; i < 8; i += 4) {  // r[i + k]: element k (lane 0) and k + 4 (lane 1) of rows i..i+3
                    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
                    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
                }
                for (int k = 0; k < 4; ++k) {
                    t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);      // column k of the 8 rows
                    t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);  // column k + 4
                }
                for (int k = 0; k < 8; ++k)
                    _mm256_storeu_ps(out[rb + k] + cb,
                                     scale ? _mm256_mul_ps(t[k], _mm256_set1_ps(scale[rb + k])) : t[k]);
            }
        }
    }

    // float32 → float16/bfloat16 by attn/half.hpp's rule (the O store of a 16-bit out).
    static void narrow16(const float* x, std::uint16_t* y, std::int64_t n, bool is_f16) {
        narrow_row_avx2(x, n, is_f16, y);
    }

    // n float16/bfloat16 values (element stride `stride`) → float32: simd/half_*.hpp, the
    // loaders the decode kernel of this ISA uses too.
    static void widen(const std::uint16_t* src, std::int64_t stride, std::int64_t n, bool is_f16, float* dst) {
        widen_row_avx2(src, stride, n, is_f16, dst);
    }

    // Dropout factors of a row segment (Philox4x32-10; the backward's implementation).
    static void dropout_row(const DropoutRowArgs& a) { dropout_row_avx2(a); }

    static void weights_exp(float* s, int ldS, int nk, int ncols, const float* m, const float* lse2) {
        const __m256 l2e = _mm256_set1_ps(kLog2e);
        for (int c = 0; c < ncols; c += 8) {
            const __m256 mv = _mm256_load_ps(m + c), lv = _mm256_load_ps(lse2 + c);
            for (int j = 0; j < nk; ++j) {
                float* sj = s + j * ldS + c;
                // 2^((s − m)·log2 e − log2 l)
                _mm256_store_ps(sj, exp2_ps(_mm256_fmsub_ps(_mm256_sub_ps(_mm256_load_ps(sj), mv), l2e, lv)));
            }
        }
    }
};

}  // namespace
}  // namespace flash_avx2_ns

void flash_forward_avx2(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) {
    flash_avx2_ns::run_flash<flash_avx2_ns::Avx2Ops>(jobs, n, tiles, threads);
}

}  // namespace attn::detail
