// The bf16 dot-product micro-kernels (bf16_dot.hpp says what they compute and why pairs).
// This file alone is compiled with ATTN_AVX512_BF16_FLAGS (the AVX-512 set plus
// -mavx512bf16, src/CMakeLists.txt); it holds no driver code, only the functions of
// bf16_dot.hpp, reached from the avx512 row's bf16 Ops (flash_avx512.cpp) on a CPU with
// AVX-512 BF16.
//
// Per step a tile issues 2 aligned loads of 32 query lanes, 8 broadcast pair words and 16
// vdpbf16ps — the f32 tile's instruction mix with twice the products per instruction; the pair
// tile of two panels (qk_tile2, pv_tile2) 4 loads, 6 broadcasts and 24 vdpbf16ps.
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "../simd/exp2_avx512.hpp"
#include "column_max_avx512.hpp"
#include "bf16_dot.hpp"
#include "tile_rows.hpp"

namespace attn::detail::flash_bf16_avx512_ns {
namespace {

// Accumulators as named variables (flash_avx512.cpp says why not arrays).
#define ATTN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

inline __m512bh pairs(__m512i x) { return (__m512bh)x; }

// One pair word, broadcast to 16 lanes (the row stride may make it unaligned: memcpy).
inline __m512bh bcast(const void* p) {
    int w;
    std::memcpy(&w, p, sizeof w);
    return pairs(_mm512_set1_epi32(w));
}

// Raw: the sums stored unscaled (c2 unread) and their column maxima into cmax[0..32) — max-ed
// into cmax's values unless first (qk_bf16_raw).
template <int R, bool Raw = false>
inline void qk_tile(const std::uint32_t* qp, const std::uint16_t* k, std::int64_t ldk, int Dp, float c2, float* s,
                    int ldS, float* cmax = nullptr, bool first = true) {
#define DECL(r) __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = _mm512_setzero_ps();
    ATTN_ROWS(DECL)
#undef DECL
    for (int p = 0; p < Dp; ++p) {
        const __m512bh q0 = pairs(_mm512_load_si512(qp + p * 32)), q1 = pairs(_mm512_load_si512(qp + p * 32 + 16));
        const std::uint16_t* kp = k + 2 * p;
#define STEP(r)                                            \
    if constexpr (R > r) {                                 \
        const __m512bh kb = bcast(kp + r * ldk);           \
        a##r##0 = _mm512_dpbf16_ps(a##r##0, kb, q0);       \
        a##r##1 = _mm512_dpbf16_ps(a##r##1, kb, q1);       \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
    if constexpr (Raw) {
        // The rows' maxima: a tree over the accumulators (the stores need no multiply to wait for).
        __m512 mx0 = a00, mx1 = a01;
#define STORE(r)                                         \
    if constexpr (R > r) {                               \
        _mm512_store_ps(s + r * ldS, a##r##0);           \
        _mm512_store_ps(s + r * ldS + 16, a##r##1);      \
        if constexpr (r > 0) {                           \
            mx0 = _mm512_max_ps(mx0, a##r##0);           \
            mx1 = _mm512_max_ps(mx1, a##r##1);           \
        }                                                \
    }
        ATTN_ROWS(STORE)
#undef STORE
        if (!first) {
            mx0 = _mm512_max_ps(mx0, _mm512_load_ps(cmax));
            mx1 = _mm512_max_ps(mx1, _mm512_load_ps(cmax + 16));
        }
        _mm512_store_ps(cmax, mx0);
        _mm512_store_ps(cmax + 16, mx1);
        return;
    }
    const __m512 vc = _mm512_set1_ps(c2);
#define STORE(r)                                                       \
    if constexpr (R > r) {                                             \
        _mm512_store_ps(s + r * ldS, _mm512_mul_ps(a##r##0, vc));      \
        _mm512_store_ps(s + r * ldS + 16, _mm512_mul_ps(a##r##1, vc)); \
    }
    ATTN_ROWS(STORE)
#undef STORE
}

// Scale = false: alpha is all 1 (the running max did not move), the accumulators load as they are.
template <int R, bool Scale>
inline void pv_tile(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, float* ot,
                    int ldO, const float* alpha) {
    // Zero without Scale: acc() takes al by value whether it reads it or not (clang warned).
    [[maybe_unused]] __m512 al0 = _mm512_setzero_ps(), al1 = al0;
    if constexpr (Scale) {
        al0 = _mm512_load_ps(alpha);
        al1 = _mm512_load_ps(alpha + 16);
    }
    auto acc = [&](const float* o, [[maybe_unused]] __m512 al) __attribute__((always_inline)) {
        if constexpr (Scale) return _mm512_mul_ps(_mm512_load_ps(o), al);
        else return _mm512_load_ps(o);
    };
#define DECL(r)                                                          \
    __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = _mm512_setzero_ps(); \
    if constexpr (R > r) {                                               \
        a##r##0 = acc(ot + r * ldO, al0);                                \
        a##r##1 = acc(ot + r * ldO + 16, al1);                           \
    }
    ATTN_ROWS(DECL)
#undef DECL
    for (int p = 0; p < Jp; ++p) {
        const std::uint32_t* pr = pp + static_cast<std::int64_t>(p) * ldP;
        const __m512bh p0 = pairs(_mm512_load_si512(pr)), p1 = pairs(_mm512_load_si512(pr + 16));
        const std::uint32_t* vr = v + p * ldv;
#define STEP(r)                                            \
    if constexpr (R > r) {                                 \
        const __m512bh vb = bcast(vr + r);                 \
        a##r##0 = _mm512_dpbf16_ps(a##r##0, vb, p0);       \
        a##r##1 = _mm512_dpbf16_ps(a##r##1, vb, p1);       \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
#define STORE(r)                                        \
    if constexpr (R > r) {                              \
        _mm512_store_ps(ot + r * ldO, a##r##0);         \
        _mm512_store_ps(ot + r * ldO + 16, a##r##1);    \
    }
    ATTN_ROWS(STORE)
#undef STORE
}
#undef ATTN_ROWS

// Two adjacent panels (64 queries) × R ≤ 6 rows: 24 accumulators + 4 pair vectors + 1 broadcast
// of 32 zmm, 4 loads and 6 broadcasts per 24 vdpbf16ps (the 8 × 32 tile: 2 and 8 per 16) — the
// float32 row's pair tile (flash_avx512.cpp). Each accumulator sums the same products in the
// same order as qk_tile's / pv_tile's: the same bits.
#define ATTN_ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)
template <int R, bool Raw>
inline void qk_tile2(const std::uint32_t* qp0, const std::uint32_t* qp1, const std::uint16_t* k, std::int64_t ldk,
                     int Dp, float c2, float* s, int ldS, float* cmax, bool first) {
#define DECL(r) __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0, a##r##3 = a##r##0;
    ATTN_ROWS6(DECL)
#undef DECL
    for (int p = 0; p < Dp; ++p) {
        const __m512bh q0 = pairs(_mm512_load_si512(qp0 + p * 32)), q1 = pairs(_mm512_load_si512(qp0 + p * 32 + 16));
        const __m512bh q2 = pairs(_mm512_load_si512(qp1 + p * 32)), q3 = pairs(_mm512_load_si512(qp1 + p * 32 + 16));
        const std::uint16_t* kp = k + 2 * p;
#define STEP(r)                                            \
    if constexpr (R > r) {                                 \
        const __m512bh kb = bcast(kp + r * ldk);           \
        a##r##0 = _mm512_dpbf16_ps(a##r##0, kb, q0);       \
        a##r##1 = _mm512_dpbf16_ps(a##r##1, kb, q1);       \
        a##r##2 = _mm512_dpbf16_ps(a##r##2, kb, q2);       \
        a##r##3 = _mm512_dpbf16_ps(a##r##3, kb, q3);       \
    }
        ATTN_ROWS6(STEP)
#undef STEP
    }
    if constexpr (Raw) {
        __m512 mx0 = a00, mx1 = a01, mx2 = a02, mx3 = a03;
#define STORE(r)                                         \
    if constexpr (R > r) {                               \
        _mm512_store_ps(s + r * ldS, a##r##0);           \
        _mm512_store_ps(s + r * ldS + 16, a##r##1);      \
        _mm512_store_ps(s + r * ldS + 32, a##r##2);      \
        _mm512_store_ps(s + r * ldS + 48, a##r##3);      \
        if constexpr (r > 0) {                           \
            mx0 = _mm512_max_ps(mx0, a##r##0);           \
            mx1 = _mm512_max_ps(mx1, a##r##1);           \
            mx2 = _mm512_max_ps(mx2, a##r##2);           \
            mx3 = _mm512_max_ps(mx3, a##r##3);           \
        }                                                \
    }
        ATTN_ROWS6(STORE)
#undef STORE
        if (!first) {
            mx0 = _mm512_max_ps(mx0, _mm512_load_ps(cmax));
            mx1 = _mm512_max_ps(mx1, _mm512_load_ps(cmax + 16));
            mx2 = _mm512_max_ps(mx2, _mm512_load_ps(cmax + 32));
            mx3 = _mm512_max_ps(mx3, _mm512_load_ps(cmax + 48));
        }
        _mm512_store_ps(cmax, mx0);
        _mm512_store_ps(cmax + 16, mx1);
        _mm512_store_ps(cmax + 32, mx2);
        _mm512_store_ps(cmax + 48, mx3);
        return;
    }
    const __m512 vc = _mm512_set1_ps(c2);
#define STORE(r)                                                       \
    if constexpr (R > r) {                                             \
        _mm512_store_ps(s + r * ldS, _mm512_mul_ps(a##r##0, vc));      \
        _mm512_store_ps(s + r * ldS + 16, _mm512_mul_ps(a##r##1, vc)); \
        _mm512_store_ps(s + r * ldS + 32, _mm512_mul_ps(a##r##2, vc)); \
        _mm512_store_ps(s + r * ldS + 48, _mm512_mul_ps(a##r##3, vc)); \
    }
    ATTN_ROWS6(STORE)
#undef STORE
}

template <int R, bool Scale>
inline void pv_tile2(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, float* ot,
                     int ldO, const float* alpha) {
    [[maybe_unused]] __m512 al0 = _mm512_setzero_ps(), al1 = al0, al2 = al0, al3 = al0;
    if constexpr (Scale) {
        al0 = _mm512_load_ps(alpha);
        al1 = _mm512_load_ps(alpha + 16);
        al2 = _mm512_load_ps(alpha + 32);
        al3 = _mm512_load_ps(alpha + 48);
    }
    auto acc = [&](const float* o, [[maybe_unused]] __m512 al) __attribute__((always_inline)) {
        if constexpr (Scale) return _mm512_mul_ps(_mm512_load_ps(o), al);
        else return _mm512_load_ps(o);
    };
#define DECL(r)                                                                              \
    __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0, a##r##3 = a##r##0; \
    if constexpr (R > r) {                                                                   \
        a##r##0 = acc(ot + r * ldO, al0);                                                    \
        a##r##1 = acc(ot + r * ldO + 16, al1);                                               \
        a##r##2 = acc(ot + r * ldO + 32, al2);                                               \
        a##r##3 = acc(ot + r * ldO + 48, al3);                                               \
    }
    ATTN_ROWS6(DECL)
#undef DECL
    for (int p = 0; p < Jp; ++p) {
        const std::uint32_t* pr = pp + static_cast<std::int64_t>(p) * ldP;
        const __m512bh p0 = pairs(_mm512_load_si512(pr)), p1 = pairs(_mm512_load_si512(pr + 16));
        const __m512bh p2 = pairs(_mm512_load_si512(pr + 32)), p3 = pairs(_mm512_load_si512(pr + 48));
        const std::uint32_t* vr = v + p * ldv;
#define STEP(r)                                            \
    if constexpr (R > r) {                                 \
        const __m512bh vb = bcast(vr + r);                 \
        a##r##0 = _mm512_dpbf16_ps(a##r##0, vb, p0);       \
        a##r##1 = _mm512_dpbf16_ps(a##r##1, vb, p1);       \
        a##r##2 = _mm512_dpbf16_ps(a##r##2, vb, p2);       \
        a##r##3 = _mm512_dpbf16_ps(a##r##3, vb, p3);       \
    }
        ATTN_ROWS6(STEP)
#undef STEP
    }
#define STORE(r)                                        \
    if constexpr (R > r) {                              \
        _mm512_store_ps(ot + r * ldO, a##r##0);         \
        _mm512_store_ps(ot + r * ldO + 16, a##r##1);    \
        _mm512_store_ps(ot + r * ldO + 32, a##r##2);    \
        _mm512_store_ps(ot + r * ldO + 48, a##r##3);    \
    }
    ATTN_ROWS6(STORE)
#undef STORE
}
#undef ATTN_ROWS6

}  // namespace

// The row counts as template arguments (tile_rows.hpp): 8-row tiles (2..8, else 1) and the
// pair tiles' 6 (2..6, else 1).
void qk_bf16(const std::uint32_t* qp, const std::uint16_t* k, std::int64_t ldk, int rows, int Dp, float c2, float* s,
             int ldS) {
    with_rows<8>(rows, [&](auto R) { qk_tile<decltype(R)::value>(qp, k, ldk, Dp, c2, s, ldS); });
}

void qk_bf16_raw(const std::uint32_t* qp, const std::uint16_t* k, std::int64_t ldk, int rows, int Dp, float* s, int ldS,
                 float* cmax, bool first) {
    with_rows<8>(rows, [&](auto R) { qk_tile<decltype(R)::value, true>(qp, k, ldk, Dp, 1.0f, s, ldS, cmax, first); });
}

void pv_bf16(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, int rows, float* ot,
             int ldO, const float* alpha) {
    with_rows<8>(rows, [&](auto R) {
        if (alpha != nullptr) pv_tile<decltype(R)::value, true>(pp, ldP, v, ldv, Jp, ot, ldO, alpha);
        else pv_tile<decltype(R)::value, false>(pp, ldP, v, ldv, Jp, ot, ldO, alpha);
    });
}

void qk_bf16_pair(const std::uint32_t* qp0, const std::uint32_t* qp1, const std::uint16_t* k, std::int64_t ldk, int rows,
                  int Dp, float c2, float* s, int ldS, float* cmax, bool first) {
    with_rows<6>(rows, [&](auto R) {
        if (cmax != nullptr) qk_tile2<decltype(R)::value, true>(qp0, qp1, k, ldk, Dp, 1.0f, s, ldS, cmax, first);
        else qk_tile2<decltype(R)::value, false>(qp0, qp1, k, ldk, Dp, c2, s, ldS, nullptr, true);
    });
}

void pv_bf16_pair(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, int rows, float* ot,
                  int ldO, const float* alpha) {
    with_rows<6>(rows, [&](auto R) {
        if (alpha != nullptr) pv_tile2<decltype(R)::value, true>(pp, ldP, v, ldv, Jp, ot, ldO, alpha);
        else pv_tile2<decltype(R)::value, false>(pp, ldP, v, ldv, Jp, ot, ldO, alpha);
    });
}

namespace {

// The interleave of vcvtne2ps2bf16(b, a) (bf16(a) in words 0..15, bf16(b) in 16..31) into 16
// pair words (a[i], b[i]).
alignas(64) constexpr short kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                               8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

inline __m512i pair_words(__m512 a, __m512 b, __m512i idx) {
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

// 2^x for the weights of the bf16 path, given xh = x + 1/2 (the softmax's exponent forms add
// the 1/2 in the FMA they already make; x = (s − m)·log2 e ≤ 8 — m the running max, which the
// lazy rescale lets lag the scores by up to 8 in base 2 (softmax_bf16) — or −inf, or NaN).
// Why degree 3: each weight is rounded to bf16 right after (relative error ≤ u = 2^-8, 8
// significant bits), so the exp needs an error well below u, not float32's 2^-24. The
// relative-error minimax polynomials of 2^f on f ∈ [−0.5, 0.5] with p(0) = 1 (so the row's
// maximum gets exactly 1) reach 1.96e-3 (degree 2: half of u, it would double the rounding
// error), 1.01e-4 (degree 3: 2^-13.3, u/39) and 2.8e-6 (degree 4): degree 3 is the lowest whose
// error disappears under the rounding. By floor, as the float32 exp2 (simd/exp2_avx512.hpp):
// g = xh − ⌊xh⌋ ∈ [0, 1) is one vreduceps (round down), p̃(g) = p(g − 1/2) ≈ 2^(g − 1/2) (the same
// fit re-expanded in g, p̃(1/2) = 1 exactly in float32), and vscalefps multiplies by 2^⌊xh⌋
// itself (it floors its second operand): p̃(g)·2^⌊xh⌋ = 2^x. No n = x − round(x) as before — one
// subtract fewer per 16 weights (kernels-lab fwd-23) — and, the 1/2 shift kept, the same breaks
// as before at half-integers x, none at x = 0 (the max). With float32 Horner and coefficients:
// ≤ 1.02e-4, checked on a dense sweep by test_bf16_compute.cpp. x < −126 → 0 exactly (the
// float32 exp2's rule: a zero weight keeps 0·inf out of P·V); −inf → 0 (vreduceps gives 0 for
// ±inf, 2^−inf = 0); NaN → NaN (the mask keeps unordered lanes). ZeroBelow = false: x in
// [−149, −126) gives the float32 denormal 2^x instead of 0 (one compare fewer), for weights that
// leave only as bf16 pairs and in l: vcvtne2ps2bf16 flushes a denormal to 0, so Pᵀ has the same
// bits, and l ≥ 1 (its max's weight) does not move by < 2^-126 per key.
template <bool ZeroBelow = true>
inline __m512 exp2_bf16_ps(__m512 xh) {
    // xh − ⌊xh⌋ (just below an integer it may round to 1: p̃(1)·2^⌊xh⌋ is 2^x within the fit's error)
    const __m512 g = _mm512_reduce_ps(xh, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.05500892922282219f), g, _mm512_set1_ps(0.15969757735729218f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(0.4923286437988281f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(0.7070351839065552f));
    if constexpr (!ZeroBelow) return _mm512_scalef_ps(p, xh);
    const __mmask16 keep = _mm512_cmp_ps_mask(xh, _mm512_set1_ps(exp2poly::kMin + 0.5f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(keep, p, xh);
}

}  // namespace

void exp2_bf16(const float* x, float* y, int n) {
    const __m512 half = _mm512_set1_ps(0.5f);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, exp2_bf16_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), half)));
    }
}

namespace {

// One 16-column group of softmax_bf16 once its new max is known: the weights 2^x(s) of nk rows,
// x + 1/2 = exponent(the Sᵀ entry) (the forms below), their sum into l, Pᵀ pairs and/or the float32 P
// (KeepF32: keep_f32; without it the weights below 2^-126 may stay denormal, exp2_bf16_ps).
template <bool KeepF32, class Exponent>
inline void softmax_columns(float* s, int ldS, int nk, int c, ColumnMax cm, __m512 al, float* m, float* l,
                            float* alpha, std::uint32_t* pp, int ldP, Exponent exponent) {
    constexpr bool keep_f32 = KeepF32;
    const __m512i idx = _mm512_load_si512(kInterleave);
    auto weight = [&](const float* sj) __attribute__((always_inline)) {
        return exp2_bf16_ps<KeepF32>(exponent(_mm512_load_ps(sj)));
    };
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 2) {
        float* s0 = s + j * ldS + c;
        const __m512 e0 = weight(s0);
        const __m512 e1 = j + 1 < nk ? weight(s0 + ldS) : _mm512_setzero_ps();
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        if constexpr (keep_f32) {
            _mm512_store_ps(s0, e0);
            if (j + 1 < nk) _mm512_store_ps(s0 + ldS, e1);
        }
        if (pp != nullptr) _mm512_store_si512(pp + (j / 2) * ldP + c, pair_words(e0, e1, idx));
    }
    _mm512_store_ps(alpha + c, al);
    _mm512_store_ps(l + c, _mm512_fmadd_ps(_mm512_load_ps(l + c), al, _mm512_add_ps(sum0, sum1)));
    _mm512_store_ps(m + c, cm.max);
}

}  // namespace

namespace {

// The lazy rescale (FlashAttention-4's): the running max m moves only in a column whose new max
// `seen` (max(m_old, the block's)) passes m_old by more than 8·ln 2, so a weight 2^x,
// x = (s − m)·log2 e, stays below 2^8 (to the roundings of seen − m_old and of x: a few units of
// 2^-24 in the exponent); elsewhere m_old stays, α = 2^0 = 1 exactly, and pv skips α·Oᵀ (both
// bf16 paths multiply only where α ≠ 1) — on random scores, once the first block has set m,
// almost always. A weight then lies in [0, 2^8], not [0, 1]: its bf16 rounding is relative, so
// the bound is the same (docs/conventions.md, "bf16 compute"); the max key's weight is still ≥ 1
// (m never passes the scores' max), so l ≥ 1 (finite.hpp); O = Oᵀ/l and lse = m + ln l hold for
// any m that l and Oᵀ share. Where m_old or seen is ±inf or NaN the difference is NaN or +inf
// (seen ≥ m_old), the compare false: m becomes seen, as without the rule.
inline __m512 lazy_max(__m512 mold, __m512 seen) {
    const __m512 slack = _mm512_set1_ps(8.0f * 0.6931471805599453f);  // 8 in base 2
    const __mmask16 keep = _mm512_cmp_ps_mask(_mm512_sub_ps(seen, mold), slack, _CMP_LE_OQ);
    return _mm512_mask_mov_ps(seen, keep, mold);
}

}  // namespace

void softmax_bf16(float* s, int ldS, int nk, int ncols, float* m, float* l, float* alpha, std::uint32_t* pp, int ldP,
                  bool keep_f32, const float* colmax, float raw_scale) {
    constexpr float kLog2e = 1.4426950408889634f;
    const __m512 l2e = _mm512_set1_ps(kLog2e), vc = _mm512_set1_ps(raw_scale);
    const __m512 vcl = _mm512_set1_ps(raw_scale * kLog2e);  // the scale and log2 e in one factor
    for (int c = 0; c < ncols; c += 16) {
        const __m512 mold = _mm512_load_ps(m + c);
        // Unscaled: the block's max scaled once — c·max_j s_j is max_j c·s_j, each rounded as qk
        // would have rounded it (c > 0: rounding is monotone), so m keeps the scaled path's bits.
        const __m512 seen = colmax == nullptr ? column_max16(s, ldS, nk, c, mold).max
                            : raw_scale > 0.0f ? _mm512_max_ps(mold, _mm512_mul_ps(_mm512_load_ps(colmax + c), vc))
                                               : _mm512_max_ps(mold, _mm512_load_ps(colmax + c));
        const ColumnMax cm = column_max_of(lazy_max(mold, seen));
        const __m512 use = cm.use;
        const __m512 al = exp2_ps512(_mm512_mul_ps(_mm512_sub_ps(mold, use), l2e));
        auto columns = [&](auto exponent) __attribute__((always_inline)) {
            if (keep_f32) softmax_columns<true>(s, ldS, nk, c, cm, al, m, l, alpha, pp, ldP, exponent);
            else softmax_columns<false>(s, ldS, nk, c, cm, al, m, l, alpha, pp, ldP, exponent);
        };
        // Each form gives exp2_bf16_ps x + 1/2, the 1/2 added in the FMA it makes anyway.
        const __m512 half = _mm512_set1_ps(0.5f);
        if (raw_scale > 0.0f) {
            // x + 1/2 = s·(c·log2 e) + (1/2 − use·log2 e): one FMA for the scale, the subtract and
            // the multiply. Its roundings differ from the scores' (c·s rounded, then use
            // subtracted: exactly 0 for the max): |Δx| ≤ 3·2^-24·(|use·log2 e| + 1), a relative
            // ≈ 3·2^-24·|use| in each weight. Up to |use| = 2^8 that is ≤ 4.6e-5, under half the
            // exp's ε (1.05e-4); past it (large scores, huge scales — the max's weight would leave
            // 1 — and use·log2 e overflowing past 2^127 / log2 e) the scores are formed first, as
            // qk would have formed them: (s·c − use)·log2 e + 1/2, the scaled path's bits. ±inf
            // and NaN maxima take the FMA: the same −inf, 0 or NaN either way.
            const __m512 nu = _mm512_fmadd_ps(use, _mm512_set1_ps(-kLog2e), half);
            const __mmask16 large = _mm512_cmp_ps_mask(_mm512_abs_ps(use), _mm512_set1_ps(0x1p8f), _CMP_GT_OQ) &
                                    ~_mm512_fpclass_ps_mask(use, 0x18);  // |use| > 2^8, not ±inf
            if (large == 0) columns([&](__m512 x) __attribute__((always_inline)) { return _mm512_fmadd_ps(x, vcl, nu); });
            else  // the score rounded on its own: GCC would contract a plain multiply into the next op
                columns([&](__m512 x) __attribute__((always_inline)) {
                    const __m512 score = _mm512_mul_round_ps(x, vc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    return _mm512_fmadd_ps(_mm512_sub_ps(score, use), l2e, half);
                });
        } else {
            columns([&](__m512 x) __attribute__((always_inline)) { return _mm512_fmadd_ps(_mm512_sub_ps(x, use), l2e, half); });
        }
    }
}

void pack_pairs_bf16(const float* src, std::int64_t ld, std::int64_t n, std::int64_t cols, std::uint32_t* dst,
                     std::int64_t ld_dst) {
    // vcvtne2ps2bf16 rounds to nearest even; kInterleave pairs the two rows' words.
    const __m512i idx = _mm512_load_si512(kInterleave);
    for (std::int64_t p = 0; p < (n + 1) / 2; ++p) {
        const float* r0 = src + 2 * p * ld;
        const bool second = 2 * p + 1 < n;
        std::uint32_t* d = dst + p * ld_dst;
        for (std::int64_t c = 0; c < cols; c += 16) {
            const __mmask16 m = cols - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (cols - c)) - 1);
            const __m512 a = _mm512_maskz_loadu_ps(m, r0 + c);
            const __m512 b = second ? _mm512_maskz_loadu_ps(m, r0 + ld + c) : _mm512_setzero_ps();
            const __m512i w = pair_words(a, b, idx);
            _mm512_mask_storeu_epi32(d + c, m, w);
        }
    }
}

}  // namespace attn::detail::flash_bf16_avx512_ns
