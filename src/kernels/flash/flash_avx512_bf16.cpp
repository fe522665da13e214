// The bf16 dot-product micro-kernels (bf16_dot.hpp says what they compute and why pairs).
// This file alone is compiled with ATTN_AVX512_BF16_FLAGS (the AVX-512 set plus
// -mavx512bf16, src/CMakeLists.txt); it holds no driver code, only these three functions,
// reached from the avx512 row's bf16 Ops (flash_avx512.cpp) on a CPU with AVX-512 BF16.
//
// Per step a tile issues 2 aligned loads of 32 query lanes, 8 broadcast pair words and 16
// vdpbf16ps — the f32 tile's instruction mix with twice the products per instruction.
#include <immintrin.h>

#include <cstring>

#include "bf16_dot.hpp"

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

template <int R>
inline void qk_tile(const std::uint32_t* qp, const std::uint16_t* k, std::int64_t ldk, int Dp, float c2, float* s,
                    int ldS) {
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
    const __m512 vc = _mm512_set1_ps(c2);
#define STORE(r)                                                       \
    if constexpr (R > r) {                                             \
        _mm512_store_ps(s + r * ldS, _mm512_mul_ps(a##r##0, vc));      \
        _mm512_store_ps(s + r * ldS + 16, _mm512_mul_ps(a##r##1, vc)); \
    }
    ATTN_ROWS(STORE)
#undef STORE
}

template <int R>
inline void pv_tile(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, float* ot,
                    int ldO, const float* alpha) {
    const __m512 al0 = _mm512_load_ps(alpha), al1 = _mm512_load_ps(alpha + 16);
#define DECL(r)                                                          \
    __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = _mm512_setzero_ps(); \
    if constexpr (R > r) {                                               \
        a##r##0 = _mm512_mul_ps(_mm512_load_ps(ot + r * ldO), al0);      \
        a##r##1 = _mm512_mul_ps(_mm512_load_ps(ot + r * ldO + 16), al1); \
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

#define ATTN_CASES(X) X(8) X(7) X(6) X(5) X(4) X(3) X(2)

}  // namespace

void qk_bf16(const std::uint32_t* qp, const std::uint16_t* k, std::int64_t ldk, int rows, int Dp, float c2, float* s,
             int ldS) {
    switch (rows) {
#define CASE(n) \
    case n: qk_tile<n>(qp, k, ldk, Dp, c2, s, ldS); break;
        ATTN_CASES(CASE)
#undef CASE
        default: qk_tile<1>(qp, k, ldk, Dp, c2, s, ldS); break;
    }
}

void pv_bf16(const std::uint32_t* pp, int ldP, const std::uint32_t* v, std::int64_t ldv, int Jp, int rows, float* ot,
             int ldO, const float* alpha) {
    switch (rows) {
#define CASE(n) \
    case n: pv_tile<n>(pp, ldP, v, ldv, Jp, ot, ldO, alpha); break;
        ATTN_CASES(CASE)
#undef CASE
        default: pv_tile<1>(pp, ldP, v, ldv, Jp, ot, ldO, alpha); break;
    }
}
#undef ATTN_CASES

void pack_pairs_bf16(const float* src, std::int64_t ld, std::int64_t n, std::int64_t cols, std::uint32_t* dst,
                     std::int64_t ld_dst) {
    // vcvtne2ps2bf16(b, a) puts bf16(a) in words 0..15 and bf16(b) in words 16..31 (round to
    // nearest even); the permutation interleaves them into 16 pair words (a[i], b[i]).
    alignas(64) static constexpr short kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_load_si512(kInterleave);
    for (std::int64_t p = 0; p < (n + 1) / 2; ++p) {
        const float* r0 = src + 2 * p * ld;
        const bool second = 2 * p + 1 < n;
        std::uint32_t* d = dst + p * ld_dst;
        for (std::int64_t c = 0; c < cols; c += 16) {
            const __mmask16 m = cols - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (cols - c)) - 1);
            const __m512 a = _mm512_maskz_loadu_ps(m, r0 + c);
            const __m512 b = second ? _mm512_maskz_loadu_ps(m, r0 + ld + c) : _mm512_setzero_ps();
            const __m512i w = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
            _mm512_mask_storeu_epi32(d + c, m, w);
        }
    }
}

}  // namespace attn::detail::flash_bf16_avx512_ns
