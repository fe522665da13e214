// The decode kernel with AVX2 + FMA + F16C. The only file of the decode kernel compiled
// with the AVX2 flags (src/CMakeLists.txt: ATTN_AVX2_SOURCES); reached only through the
// kernel table's AVX2 row (isa.cpp). To keep AVX2 code from leaking into the portable build, this file
// defines everything with internal linkage and uses no inline C++ library templates
// (std::min, std::vector, <cmath> wrappers): the linker could otherwise keep this file's
// AVX2 copy of such a function for the whole program.
#include <immintrin.h>

#include "../isa.hpp"
#include "../simd/exp2_avx2.hpp"
#include "../simd/half_avx2.hpp"
#include "decode_core.hpp"

namespace attn::detail {
namespace {

struct Avx2Ops {
    struct Half { std::uint16_t bits; };   // IEEE float16
    struct Brain { std::uint16_t bits; };  // bfloat16: the top half of a float32

    // The 16-bit loaders are simd/half_avx2.hpp's (shared with flash_avx2.cpp).
    static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
    static __m256 load8(const Half* p) { return f16x8_to_ps(&p->bits); }
    static __m256 load8(const Brain* p) { return bf16x8_to_ps(&p->bits); }
    static float load1(const float* p) { return *p; }
    static float load1(const Half* p) { return f16_to_ps1(p->bits); }
    static float load1(const Brain* p) { return bf16_to_ps1(p->bits); }

    // Horizontal sums of 8 vectors: lane x of the result is the sum of the lanes of a[x].
    __attribute__((always_inline)) static inline __m256 hsum8(const __m256* a) {
        const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
        // t0 = [a0..a3 low-lane sums | a0..a3 high-lane sums], t1 the same for a4..a7.
        return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
    }

    static float hsum(__m256 v) {
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        x = _mm_add_ss(x, _mm_movehdup_ps(x));
        return _mm_cvtss_f32(x);
    }

    // One query row × 8 keys per tile: 8 independent accumulators, one per key, enough to
    // hide the FMA latency. Keys past n repeat key n−1 and are discarded.
    // Key-major: each K row is read whole before the next (decode_avx512.cpp's score_keys
    // says why: AMD's prefetchers follow 8 interleaved rows badly); each key's sum keeps its
    // order, so the bits are the same.
    // KS > 0: kstride == KS, known at compile time, for the whole tiles (the last, partial
    // one runs with KS = 0): one base pointer plus constant offsets, where GCC reloaded the
    // 8 run-time row pointers from the stack before every K load (decode_avx512.cpp has the
    // same split). Same arithmetic, same bits.
    template <class T, i64 KS = 0>
    static void score_tile(const float* q, const T* k, i64 kstride, i64 n, i64 Dk, float* s) {
        i64 j = 0;
        if constexpr (KS > 0) {
            for (; j + 8 <= n; j += 8) score_keys<T, KS>(q, k + j * KS, KS, 8, Dk, s + j);
        }
        for (; j < n; j += 8) score_keys<T, 0>(q, k + j * kstride, kstride, n - j, Dk, s + j);
    }

    // One tile: keys 0 .. 7 of k (row stride KS, or kstride when KS = 0).
    template <class T, i64 KS>
    __attribute__((always_inline)) static inline void score_keys(const float* q, const T* k, i64 kstride, i64 n,
                                                                 i64 Dk, float* s) {
        const i64 Dk8 = Dk & ~i64{7};
        __m256 acc[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
            const T* kt = KS > 0 ? k + t * KS : k + imin(t, n - 1) * kstride;
            __m256 a = _mm256_setzero_ps();
            for (i64 d = 0; d < Dk8; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kt + d), a);
            acc[t] = a;
            // Keep the rows in program order: GCC's scheduler would interleave them again.
            __asm__ volatile("" : "+x"(acc[t]));
            __asm__ volatile("" : "+r"(k));
        }
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, hsum8(acc));
        for (i64 d = Dk8; d < Dk; ++d)
            for (int t = 0; t < 8; ++t) {
                const float kd = load1((KS > 0 ? k + t * KS : k + imin(t, n - 1) * kstride) + d);
                // An explicit fma (as acc_tile's edge): left to contraction, GCC fused the
                // float32 and the 16-bit instantiations differently, so the same values
                // stored in 16 bits gave other bits than in float32.
                tmp[t] = __builtin_fmaf(q[d], kd, tmp[t]);
            }
        for (int t = 0; t < 8 && t < n; ++t) s[t] = tmp[t];
    }

    // R query rows (R = 2 or 4: a GQA group) × 8/R keys per tile: each K vector loaded (and
    // converted) once for the R rows (decode_avx512.cpp's score_tile_rows says why). Key-major:
    // that row's head-dim-major order was level or slower here under ATTN_ISA=avx2 on Zen 5
    // (Zen 3 not measured; BENCHMARKS.md, 2026-12-05 19:05). Each (row, key) dot product keeps the one-row tile's chain, hsum8 and scalar tail: same bits.
    // Each tile requests the next block's rows of its keys (decode_core.hpp's Lookahead).
    template <int R, class T>
    static void score_tile_rows(const float* q, i64 qstride, const T* k, i64 kstride, i64 n, i64 Dk, float* s,
                                i64 sstride, Lookahead<T>& next) {
        constexpr int KT = 8 / R;
        const i64 Dk8 = Dk & ~i64{7};
        for (i64 j = 0; j < n; j += KT) {
            __m256 acc[8];
#pragma GCC unroll 8
            for (int t = 0; t < KT; ++t) {
                const T* kt = k + imin(j + t, n - 1) * kstride;
                __m256 a[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_ps();
                for (i64 d = 0; d < Dk8; d += 8) {
                    const __m256 kv = load8(kt + d);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * qstride + d), kv, a[r]);
                }
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    acc[r * KT + t] = a[r];
                    __asm__ volatile("" : "+x"(acc[r * KT + t]));  // the keys in program order
                }
                __asm__ volatile("" : "+r"(k));
            }
            next.step(KT * next.row_lines);
            alignas(32) float tmp[8];
            _mm256_store_ps(tmp, hsum8(acc));
            for (i64 d = Dk8; d < Dk; ++d)
                for (int t = 0; t < KT; ++t) {
                    const float kd = load1(k + imin(j + t, n - 1) * kstride + d);
                    for (int r = 0; r < R; ++r) tmp[r * KT + t] = __builtin_fmaf(q[r * qstride + d], kd, tmp[r * KT + t]);
                }
            for (int r = 0; r < R; ++r)
                for (int t = 0; t < KT && j + t < n; ++t) s[r * sstride + j + t] = tmp[r * KT + t];
        }
    }

    template <class T>
    static void scores(const float* q, i64 qstride, int R, const KeyRun<T>* k, int nruns, i64 kstride, i64 Dk,
                       float* s, i64 sstride, Lookahead<T>& next) {
        vector_scores<Avx2Ops, T>(q, qstride, R, k, nruns, kstride, Dk, s, sstride, next);
    }

    static float exp2_1(float x) { return _mm_cvtss_f32(_mm256_castps256_ps128(exp2_ps(_mm256_set1_ps(x)))); }

    static float row_max(const float* s, i64 n) {
        __m256 mv = _mm256_set1_ps(-INFINITY);
        i64 j = 0;
        for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
        __m128 x = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        x = _mm_max_ps(x, _mm_movehl_ps(x, x));
        x = _mm_max_ss(x, _mm_movehdup_ps(x));
        float mx = _mm_cvtss_f32(x);
        for (; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
        return mx;
    }

    static float exp_shift(float* s, i64 n, float m) {
        const __m256 mv = _mm256_set1_ps(m), l2e = _mm256_set1_ps(kLog2e), floor = _mm256_set1_ps(kWeightFloor),
                     ninf = _mm256_set1_ps(-INFINITY);
        __m256 sum = _mm256_setzero_ps();
        i64 j = 0;
        for (; j + 8 <= n; j += 8) {
            // A masked score (−inf) gets weight exactly 0 (exp2_ps gives 0 below −126), and so
            // does an exponent below the floor (decode_core.hpp's kept_exponent, vectorised).
            __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv), l2e);
            x = _mm256_blendv_ps(x, ninf, _mm256_cmp_ps(x, floor, _CMP_LT_OQ));
            const __m256 e = exp2_ps(x);
            _mm256_storeu_ps(s + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        float total = hsum(sum);
        for (; j < n; ++j) {
            const float e = exp2_1(kept_exponent((s[j] - m) * kLog2e));
            s[j] = e;
            total += e;
        }
        return total;
    }

    // o[r][d0 .. d0+8C) for R rows: R·C accumulators held in registers over the whole block;
    // each V vector is loaded (and converted) once for the R rows. Each key requests
    // `next_lines` lines of the next block's V (decode_core.hpp's ahead_lines).
    template <int R, int C, class T>
    static void acc_chunk(float* o, i64 ostride, const float* alpha, const float* p, i64 pstride, const KeyRun<T>* v,
                          int nruns, i64 vstride, i64 d0, Lookahead<T>& next, i64 next_lines) {
        // One flat array, every loop fully unrolled: GCC then keeps it in registers (a 2-D
        // array of vectors was kept in memory and stored back on every key).
        __m256 acc[R * C];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m256 al = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) acc[r * C + c] = _mm256_mul_ps(_mm256_loadu_ps(o + r * ostride + d0 + 8 * c), al);
        }
        // The runs in order, the accumulators staying in registers: the same chain of FMAs
        // as one run holding all the keys.
        const float* pj = p;
        for (int x = 0; x < nruns; ++x) {
            for (i64 j = 0; j < v[x].n; ++j, ++pj) {
                const T* vj = v[x].rows + j * vstride + d0;  // indexed: no pointer past the last row
                __m256 pb[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) pb[r] = _mm256_broadcast_ss(pj + r * pstride);
                next.step(next_lines);
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) {
                    const __m256 vv = load8(vj + 8 * c);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) acc[r * C + c] = _mm256_fmadd_ps(pb[r], vv, acc[r * C + c]);
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) _mm256_storeu_ps(o + r * ostride + d0 + 8 * c, acc[r * C + c]);
    }

    template <int R, class T>
    static void acc_tile(float* o, i64 ostride, const float* alpha, const float* p, i64 pstride, const KeyRun<T>* v,
                         int nruns, i64 vstride, i64 Dv, Lookahead<T>& next, i64 key_lines) {
        constexpr int C = 8 / R;
        // key_lines per key in all, spread over the chunks' passes.
        const i64 chunks = Dv / (8 * C) + (Dv % (8 * C)) / 8;
        const i64 next_lines = chunks > 0 ? (key_lines + chunks - 1) / chunks : 0;
        i64 d0 = 0;
        for (; d0 + 8 * C <= Dv; d0 += 8 * C)
            acc_chunk<R, C>(o, ostride, alpha, p, pstride, v, nruns, vstride, d0, next, next_lines);
        for (; d0 + 8 <= Dv; d0 += 8) acc_chunk<R, 1>(o, ostride, alpha, p, pstride, v, nruns, vstride, d0, next, next_lines);
        for (int r = 0; r < R; ++r)
            for (i64 d = d0; d < Dv; ++d) {
                // An explicit fma chain over the runs in order: left to contraction, the
                // compiler could fuse o·alpha with the first product (fma(o, alpha, p·v), p·v
                // rounded on its own), and the 16-bit and float32 instantiations must give the
                // bits of the same unbroken chain (paged == contiguous, any storage).
                float a = o[r * ostride + d] * alpha[r];
                const float* pj = p + r * pstride;
                for (int x = 0; x < nruns; ++x)
                    for (i64 j = 0; j < v[x].n; ++j, ++pj) a = __builtin_fmaf(*pj, load1(v[x].rows + j * vstride + d), a);
                o[r * ostride + d] = a;
            }
    }

    template <class T>
    static void accumulate(float* o, i64 ostride, const float* alpha, const float* p, i64 pstride, int R,
                           const KeyRun<T>* v, int nruns, i64 vstride, i64 Dv, Lookahead<T>& next) {
        // One row at a time, whole V rows in address order (16 ymm registers: R rows of a
        // whole head-dim row do not fit, and thinner head-dim slices read V in the pattern
        // that was slow; decode_avx512.cpp's score_keys), each pass requesting its share of
        // the next block's V (ahead_lines).
        const i64 key_lines = ahead_lines(next.row_lines, R);
        for (int r = 0; r < R; ++r)
            acc_tile<1>(o + r * ostride, ostride, alpha + r, p + r * pstride, pstride, v, nruns, vstride, Dv, next,
                        key_lines);
    }
};

}  // namespace

void decode_avx2(const SdpaProblem& p, const DecodeWork& w) { decode_entry<Avx2Ops>(p, w); }

}  // namespace attn::detail
