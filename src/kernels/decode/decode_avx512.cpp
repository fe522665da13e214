// The decode kernel with AVX-512 (F+VL+BW+DQ; the algorithm is decode_core.hpp). The only
// decode file compiled with the AVX-512 flags (src/CMakeLists.txt: ATTN_AVX512_SOURCES);
// reached only through the kernel table's avx512 row (isa.cpp). Everything has internal
// linkage and no inline C++ library templates are used (decode_avx2.cpp says why).
//
// Decode is bound by reading K and V once: the point of zmm here is 64-byte loads (one per
// cache line), float16 → float32 with one vcvtph2ps per 16 values, and the head-dim edge
// (D % 16) as a masked load instead of a scalar loop.
#include <immintrin.h>

#include "../isa.hpp"
#include "../simd/exp2_avx512.hpp"
#include "../simd/half_avx512.hpp"
#include "decode_core.hpp"

namespace attn::detail {
namespace {

inline __mmask16 lanes(i64 n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u); }

struct Avx512Ops {
    struct Half { std::uint16_t bits; };   // IEEE float16
    struct Brain { std::uint16_t bits; };  // bfloat16: the top half of a float32

    // 16 values (lanes past `m` read nothing and are 0). The 16-bit loaders are
    // simd/half_avx512.hpp's (shared with flash_avx512.cpp).
    static __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
    static __m512 load16(const Half* p, __mmask16 m) { return f16x16_to_ps(&p->bits, m); }
    static __m512 load16(const Brain* p, __mmask16 m) { return bf16x16_to_ps(&p->bits, m); }
    static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
    static __m512 load16(const Half* p) { return f16x16_to_ps(&p->bits); }
    static __m512 load16(const Brain* p) { return bf16x16_to_ps(&p->bits); }
    static float load1(const float* p) { return *p; }
    static float load1(const Half* p) { return f16_to_ps1(p->bits); }
    static float load1(const Brain* p) { return bf16_to_ps1(p->bits); }

    // Lane x of the result is the sum of the 16 lanes of a[x], x < 8. Inlined: out of line
    // (as GCC left it once score_tile had its own instances), each tile stored its 8
    // accumulators to the stack for the call.
    __attribute__((always_inline)) static inline __m256 hsum8(const __m512* a) {
        __m256 h[8];
#pragma GCC unroll 8
        for (int x = 0; x < 8; ++x) h[x] = _mm256_add_ps(_mm512_castps512_ps256(a[x]), _mm512_extractf32x8_ps(a[x], 1));
        const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
        const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
        return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
    }

    // Lane x of the result is the sum of the 16 lanes of a[x], x < 16, by the same tree as
    // hsum8 (lanes i and i + 8, then neighbours, then pairs of those, then the two halves), so
    // a dot product summed here has hsum8's bits. A butterfly over the 16 vectors: 30 shuffles
    // and 15 adds for 16 sums, where hsum8 takes 22 shuffles (each vhaddps is two) and 15 adds
    // for 8 — on Sapphire Rapids the shuffles share port 5 with the FMAs, and S7's group tile
    // spent more time in hsum8 than in its products (docs/kernels-lab.md, dec-11).
    // The stages leave the sum of v[k] in a fixed lane (below); v is a's order permuted so that
    // a[x]'s sum lands in lane x.
    __attribute__((always_inline)) static inline __m512 hsum16(const __m512* a) {
        // Output lane 4b + e holds v[2e] (b = 0), v[2e + 1] (b = 1), v[8 + 2e] (2), v[9 + 2e] (3).
        constexpr int kInput[16] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};  // v[k] = a[kInput[k]]
        __m512 x[8], z[4], w[2];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {  // lanes i and i + 8: v[2i]'s in lanes 0-7, v[2i+1]'s in 8-15
            const __m512 u = a[kInput[2 * i]], v = a[kInput[2 * i + 1]];
            x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0x44), _mm512_shuffle_f32x4(u, v, 0xEE));
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)  // neighbours: (h0 + h1, h2 + h3) within each 128-bit block
            z[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x88),
                                 _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xDD));
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i)  // pairs of those: (h0 + h1) + (h2 + h3), and of h4 .. h7
            w[i] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * i], z[2 * i + 1], 0x88),
                                 _mm512_shuffle_ps(z[2 * i], z[2 * i + 1], 0xDD));
        // the two halves: blocks 0 + 1 and 2 + 3 of each
        return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
    }

    // One query row × 8 keys per tile: 8 independent accumulators, one per key; the
    // head-dim edge is a masked load of Q and K. Keys past n repeat key n−1 and are discarded.
    //
    // Key-major: each K row is read whole (its lines in address order) before the next one.
    // The head-dim-major order (line d of keys 0..7, then line d+1) reads a tile's 8 rows as
    // 8 interleaved streams 512 B apart, which AMD's prefetchers follow badly: on Zen 4 a
    // plain read of a 512 MiB cache in that order ran at 7.9 GB/s on one core against 26–28
    // GB/s key-major (docs/kernels-lab.md, "Decode: key-major score tiles"). The 8 chains
    // are still independent (the out-of-order window holds the whole tile), and each key's
    // sum keeps its order: same bits.
    //
    // KS > 0: kstride == KS, known at compile time, for the tiles that are whole (the last,
    // partial one runs with KS = 0). The 8 K rows of a tile are then one base pointer plus
    // constant offsets; with a run-time stride GCC kept the 8 row pointers in vector
    // registers inside run_item and moved one to a general register before every K load
    // (8 vmovq per 8 FMAs). DK > 0: Dk == DK (no edge), so Q stays in registers.
    //
    // A 16-bit K row also requests, after its products, the row kNearKeys keys ahead (near_k).
    template <class T, i64 KS = 0>
    static void score_tile(const float* q, const T* k, i64 kstride, i64 n, i64 Dk, float* s) {
        const i64 Dk16 = Dk & ~i64{15};
        const __mmask16 edge = lanes(Dk - Dk16);
        const i64 lines = (Dk * static_cast<i64>(sizeof(T)) + 63) / 64;
        i64 j = 0;
        if constexpr (KS > 0) {
            if (Dk == KS)
                for (; j + 8 <= n; j += 8) score_keys<T, KS, KS>(q, k + j * KS, KS, 8, KS, 0, s + j, lines);
            for (; j + 8 <= n; j += 8) score_keys<T, KS, 0>(q, k + j * KS, KS, 8, Dk16, edge, s + j, lines);
        }
        for (; j < n; j += 8) score_keys<T, 0, 0>(q, k + j * kstride, kstride, n - j, Dk16, edge, s + j, lines);
    }

    // How far ahead a 16-bit K row of the one-row tile requests (near_k): 16 keys, 4 KiB at
    // D = 128. Rows one at a time (S5) read K and V at the rate memory gives them, but a 16-bit
    // row carries twice the conversions and products per byte of a float32 row, and each key's
    // dot product is one chain of D/16 FMAs that waits for its lines: with the hardware
    // prefetchers alone S5 float16 read ≈ 80 % of one core's bandwidth where float32 read ≈ 100 %.
    // Measured on one Zen 5 thread (S5 cold, CPU time, alternated in one process;
    // docs/kernels-lab.md#dec-17): 16 keys ahead into L2 (prefetcht1) 0.88–0.92× the float16 step, into
    // L1 (prefetcht0) 0.90–0.96×, 8 keys 0.94–0.96×, 4 keys level or slower; one block ahead
    // (Lookahead's distance) slower (1.03–1.14×); V's rows requested as well no further gain.
    static constexpr i64 kNearKeys = 16;

    // Requests the `lines` lines of the row kNearKeys rows after `row` (stride elements apart)
    // into L2. Unsigned arithmetic: the row may not exist (past the run, or a size-1 dimension's
    // arbitrary stride), and a prefetch of any address is harmless where forming the pointer
    // would not be.
    template <class T>
    __attribute__((always_inline)) static inline void near_k(const T* row, i64 stride, i64 lines) {
        const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(row) +
                                  static_cast<std::uintptr_t>(stride) * static_cast<std::uintptr_t>(kNearKeys * sizeof(T));
        for (i64 l = 0; l < lines; ++l) __builtin_prefetch(reinterpret_cast<const char*>(at + 64 * static_cast<std::uintptr_t>(l)), 0, 2);
    }

    // One tile: keys 0 .. 7 of k (row stride KS, or kstride when KS = 0; keys past n repeat
    // key n−1 and are discarded). lines: cache lines per K row (near_k).
    template <class T, i64 KS, i64 DK>
    __attribute__((always_inline)) static inline void score_keys(const float* q, const T* k, i64 kstride, i64 n,
                                                                 i64 Dk16, __mmask16 edge, float* s, i64 lines) {
        constexpr i64 kNq = DK > 0 ? DK / 16 : 1;
        __m512 qv[kNq];
        if constexpr (DK > 0) {
#pragma GCC unroll 16
            for (i64 c = 0; c < kNq; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
        }
        __m512 acc[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
            const T* kt = KS > 0 ? k + t * KS : k + imin(t, n - 1) * kstride;
            __m512 a = _mm512_setzero_ps();
            if constexpr (DK > 0) {
#pragma GCC unroll 16
                for (i64 c = 0; c < kNq; ++c) a = _mm512_fmadd_ps(qv[c], load16(kt + 16 * c), a);
            } else {
                for (i64 d = 0; d < Dk16; d += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(kt + d), a);
                if (edge != 0) a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(edge, q + Dk16), load16(kt + Dk16, edge), a);
            }
            acc[t] = a;
            if constexpr (sizeof(T) == 2) {
                if constexpr (DK > 0) near_k(kt, kstride, (DK * 2 + 63) / 64);
                else near_k(kt, kstride, lines);
            }
            // Keep the rows in program order (GCC's scheduler otherwise interleaves 3-4 rows).
            __asm__ volatile("" : "+v"(acc[t]));
            __asm__ volatile("" : "+r"(k));
        }
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, hsum8(acc));
        for (int t = 0; t < 8 && t < n; ++t) s[t] = tmp[t];
    }

    // R query rows (R = 2 or 4: a GQA group) × 8/R keys per tile: each K vector is loaded (and
    // converted) once for the R rows. On Zen 4 `vcvtph2ps zmm` issues every second cycle, and
    // converting every K and V row again for each of S7's 4 rows made its float16 step
    // compute-bound (10.9 ns per row and key from L3, as slow as float32 from memory); float32
    // rows one at a time reread the block from L2 in each row's pass (accumulate says more).
    // Head-dim-major inside the tile: each 16-wide slice of the R query rows is loaded once
    // and meets the 8/R keys' slices, R + 8/R loads per 8 FMAs. Key-major (each key's row
    // whole, the R query slices reloaded per key) took R + 1 loads per R FMAs, and on Zen 5
    // the loads, not the FMAs, set the pace: S7 float32 there ran 1.2× slower than rows one at a
    // time (BENCHMARKS.md, 2026-12-05). Each (row, key) dot product keeps the one-row tile's
    // chain over the head dim and its hsum8 tree: same bits.
    // Each tile requests the next block's rows of its keys (`next`, decode_core.hpp's Lookahead:
    // the group's compute per key is R times a row's, enough to hide their arrival).
    //
    // 16 accumulators (R rows × 16/R keys), summed by hsum16: per 16 dot products half the
    // shuffles of two hsum8 tiles, and R + 16/R loads per 16 FMAs.
    template <int R, class T>
    static void score_tile_rows(const float* q, i64 qstride, const T* k, i64 kstride, i64 n, i64 Dk, float* s,
                                i64 sstride, Lookahead<T>& next) {
        constexpr int KT = 16 / R;
        const i64 Dk16 = Dk & ~i64{15};
        const __mmask16 edge = lanes(Dk - Dk16);
        for (i64 j = 0; j < n; j += KT) {
            const T* kt[KT];
#pragma GCC unroll 8
            for (int t = 0; t < KT; ++t) kt[t] = k + imin(j + t, n - 1) * kstride;
            __m512 acc[16];  // acc[r * KT + t]: row r against key j + t
#pragma GCC unroll 16
            for (int x = 0; x < 16; ++x) acc[x] = _mm512_setzero_ps();
            const auto slice = [&](i64 d, __mmask16 m) {
                __m512 qv[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) qv[r] = _mm512_maskz_loadu_ps(m, q + r * qstride + d);
#pragma GCC unroll 8
                for (int t = 0; t < KT; ++t) {
                    const __m512 kv = m == 0xFFFF ? load16(kt[t] + d) : load16(kt[t] + d, m);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) acc[r * KT + t] = _mm512_fmadd_ps(qv[r], kv, acc[r * KT + t]);
                }
            };
            // The tile's requests for the next block (KT rows' lines): one line after each slice,
            // the rest after the tile. Measured on Sapphire Rapids (S7, one thread, cold step):
            // float16 all after the tile 55.5 ns per KV row, two per slice 52, one per slice 46.5
            // (the 2-key tile's 8 after it: 53); float32 level (dec-12).
            for (i64 d = 0; d < Dk16; d += 16) {
                slice(d, 0xFFFF);
                next.step(1);
            }
            if (edge != 0) slice(Dk16, edge);
            next.step(imax(KT * next.row_lines - Dk16 / 16, 0));
            // Row r's KT scores are lanes r·KT ..: rotated down to lane 0 and stored under a mask
            // (a scalar copy through a stack array took 5 % of the tile).
            const __m512 sum = hsum16(acc);
            const __mmask16 valid = lanes(imin(KT, n - j));
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m512i from = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                      _mm512_set1_epi32(r * KT));
                _mm512_mask_storeu_ps(s + r * sstride + j, valid, _mm512_permutexvar_ps(from, sum));
            }
        }
    }

    template <class T>
    static void scores(const float* q, i64 qstride, int R, const KeyRun<T>* k, int nruns, i64 kstride, i64 Dk,
                       float* s, i64 sstride, Lookahead<T>& next) {
        vector_scores<Avx512Ops, T>(q, qstride, R, k, nruns, kstride, Dk, s, sstride, next);
    }

    static float exp2_1(float x) { return _mm512_cvtss_f32(exp2_ps512(_mm512_set1_ps(x))); }

    static float row_max(const float* s, i64 n) {
        const __m512 ninf = _mm512_set1_ps(-INFINITY);
        __m512 mv = ninf;
        // max(x, mv) returns mv when x is NaN: NaN scores are skipped here (decode_core.hpp
        // sends them to l and o through exp_shift).
        for (i64 j = 0; j < n; j += 16) mv = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, lanes(n - j), s + j), mv);
        return _mm512_reduce_max_ps(mv);
    }

    static float exp_shift(float* s, i64 n, float m) {
        const __m512 mv = _mm512_set1_ps(m), l2e = _mm512_set1_ps(kLog2e), floor = _mm512_set1_ps(kWeightFloor),
                     ninf = _mm512_set1_ps(-INFINITY);
        __m512 sum = _mm512_setzero_ps();
        for (i64 j = 0; j < n; j += 16) {
            const __mmask16 k = lanes(n - j);
            // A masked score (−inf) gets weight exactly 0 (exp2_ps512 gives 0 below −126), and so
            // does an exponent below the floor (decode_core.hpp's kept_exponent, vectorised).
            __m512 x = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mv), l2e);
            x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ), ninf);
            const __m512 e = exp2_ps512(x);
            _mm512_mask_storeu_ps(s + j, k, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
        }
        return _mm512_reduce_add_ps(sum);
    }

    // acc[r·C + c] += p[r][k] · v_k[16c ..] for keys k = 0, 1 (weights pj[r·pstride + k], V rows
    // vj and vj + vstride): key 0 before key 1 in each accumulator's chain.
    template <int R, int C, class T, bool kFull>
    __attribute__((always_inline)) static inline void add_key_pair(__m512* acc, const float* pj, i64 pstride,
                                                                   const T* vj, i64 vstride, __mmask16 last) {
        __m512 pb[2 * R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            pb[r] = _mm512_set1_ps(pj[r * pstride]);
            pb[R + r] = _mm512_set1_ps(pj[r * pstride + 1]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            const bool edge = c == C - 1 && !kFull;
            const __m512 v0 = edge ? load16(vj + 16 * c, last) : load16(vj + 16 * c);
            const __m512 v1 = edge ? load16(vj + vstride + 16 * c, last) : load16(vj + vstride + 16 * c);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) acc[r * C + c] = _mm512_fmadd_ps(pb[r], v0, acc[r * C + c]);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) acc[r * C + c] = _mm512_fmadd_ps(pb[R + r], v1, acc[r * C + c]);
        }
    }

    // o[r][d0 .. d0+16C) for R rows: R·C accumulators held in registers over the whole
    // block; each V vector is loaded (and converted) once for the R rows. The last vector
    // of the chunk runs under `last` (the head-dim edge) unless kFull: GCC issued that masked
    // load first, so every V row was touched at its last line before its first, and P·V
    // alone ran at 10 GB/s on a Zen 4 core against 15 with plain loads (docs/kernels-lab.md,
    // "Decode: key-major score tiles").
    // R > 1 (a GQA group): each key also requests `next_lines` lines of the next block's V
    // rows (Lookahead; score_tile_rows says why).
    template <int R, int C, class T, bool kFull>
    static void acc_chunk(float* o, i64 ostride, const float* alpha, const float* p, i64 pstride, const KeyRun<T>* v,
                          int nruns, i64 vstride, i64 d0, __mmask16 last, Lookahead<T>& next, i64 next_lines) {
        // One flat array, every loop fully unrolled: GCC then keeps it in registers.
        __m512 acc[R * C];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m512 al = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c)
                acc[r * C + c] = _mm512_mul_ps(
                    _mm512_maskz_loadu_ps(c == C - 1 ? last : static_cast<__mmask16>(0xFFFF), o + r * ostride + d0 + 16 * c),
                    al);
        }
        // The runs in order, the accumulators staying in registers: the same chain of FMAs
        // as one run holding all the keys. A GQA group with a 16-bit cache takes two keys per
        // pass, their requests in one step: a one-key pass is 24 vector instructions among ≈ 71
        // (the loop, the Lookahead call, stack reloads), a pair ≈ 12 fewer per key, and S7's
        // cold step on one Zen 5 thread read 3.5–13.5 points more of the sampled bandwidth
        // (float16, bfloat16). Float32 keeps one key per pass: its pairs ran 2–8 % faster from
        // the L3 but 1–3 % slower from memory (docs/kernels-lab.md, dec-15). Each accumulator
        // still adds key j before key j + 1: same bits.
        const float* pj = p;
        for (int x = 0; x < nruns; ++x) {
            i64 j = 0;
            if constexpr (R > 1 && sizeof(T) == 2) {
                for (; j + 2 <= v[x].n; j += 2, pj += 2) {
                    next.step(2 * next_lines);
                    add_key_pair<R, C, T, kFull>(acc, pj, pstride, v[x].rows + j * vstride + d0, vstride, last);
                }
            }
            for (; j < v[x].n; ++j, ++pj) {
                const T* vj = v[x].rows + j * vstride + d0;  // indexed: no pointer past the last row
                __m512 pb[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) pb[r] = _mm512_set1_ps(pj[r * pstride]);
                if constexpr (R > 1) next.step(next_lines);
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) {
                    const __m512 vv = c == C - 1 && !kFull ? load16(vj + 16 * c, last) : load16(vj + 16 * c);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) acc[r * C + c] = _mm512_fmadd_ps(pb[r], vv, acc[r * C + c]);
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c)
                _mm512_mask_storeu_ps(o + r * ostride + d0 + 16 * c, c == C - 1 ? last : static_cast<__mmask16>(0xFFFF),
                                      acc[r * C + c]);
    }

    // Chunks of up to 8 vectors of 16 head-dim entries for one row, 16/R for R rows (at most
    // 16 accumulators, with R broadcasts and the V vector 21 of the 32 zmm), as wide as Dv
    // allows, so that one row (R = 1) at Dv = 64 still has 4 independent chains.
    template <int R, class T>
    static void acc_tile(float* o, i64 ostride, const float* alpha, const float* p, i64 pstride, const KeyRun<T>* v,
                         int nruns, i64 vstride, i64 Dv, Lookahead<T>& next) {
        constexpr int Cmax = R == 1 ? 8 : 16 / R;
        // The next block's V rows spread over the chunks' passes: one row's lines per key in all.
        const i64 chunks = (Dv + 16 * Cmax - 1) / (16 * Cmax), next_lines = (next.row_lines + chunks - 1) / chunks;
        for (i64 d0 = 0; d0 < Dv; d0 += 16 * Cmax) {
            const i64 rest = Dv - d0;
            const i64 nv = (rest + 15) / 16;
            const int C = nv < Cmax ? static_cast<int>(nv) : Cmax;
            const __mmask16 last = lanes(rest - 16 * (C - 1));
            switch (C) {
#define ATTN_C(c)                                                                                        \
    case c:                                                                                              \
        if constexpr (c <= Cmax) {                                                                       \
            if (last == 0xFFFF) acc_chunk<R, c, T, true>(o, ostride, alpha, p, pstride, v, nruns, vstride, d0, last, next, next_lines); \
            else acc_chunk<R, c, T, false>(o, ostride, alpha, p, pstride, v, nruns, vstride, d0, last, next, next_lines); \
        }                                                                                                \
        break;
                ATTN_C(8) ATTN_C(7) ATTN_C(6) ATTN_C(5) ATTN_C(4) ATTN_C(3) ATTN_C(2)
#undef ATTN_C
                default:
                    acc_chunk<R, 1, T, false>(o, ostride, alpha, p, pstride, v, nruns, vstride, d0, last, next, next_lines);
                    break;
            }
        }
    }

    template <class T>
    static void accumulate(float* o, i64 ostride, const float* alpha, const float* p, i64 pstride, int R,
                           const KeyRun<T>* v, int nruns, i64 vstride, i64 Dv, Lookahead<T>& next) {
        // A GQA group (R = 2 or 4): the R rows together, each V vector loaded (and converted)
        // once for them, in head-dim halves at Dv = 128 for R = 4. For 16-bit V the conversion
        // is the point (score_tile_rows says why); for float32 it is the rereading: with rows
        // one at a time every row's pass read the block again from L2, and one thread of S7
        // float32 took the time of its compute plus its reading (docs/kernels-lab.md, "Decode:
        // float32 groups together"). Same bits: every output element keeps its chain over the keys.
        if (R == 4) return acc_tile<4>(o, ostride, alpha, p, pstride, v, nruns, vstride, Dv, next);
        if (R == 2) return acc_tile<2>(o, ostride, alpha, p, pstride, v, nruns, vstride, Dv, next);
        acc_tile<1>(o, ostride, alpha, p, pstride, v, nruns, vstride, Dv, next);
    }
};

}  // namespace

void decode_avx512(const SdpaProblem& p, const DecodeWork& w) { decode_entry<Avx512Ops>(p, w); }

}  // namespace attn::detail
