// The decode algorithm, written once and compiled twice: by decode_portable.cpp with
// portable vector ops and by decode_avx2.cpp with AVX2/FMA/F16C ops. Everything here has
// internal linkage (anonymous namespace): the two copies must never be merged by the
// linker, or the portable build could end up running AVX2 code on an older CPU.
//
// The including file defines, before including this header, a struct `Ops` with:
//   template <class T> static void scores(const float* q, int64 qstride, int R,
//       const KeyRun<T>* k, int nruns, int64 kstride, int64 Dk, float* s, int64 sstride,
//       Lookahead<T>& next);
//         // s[r][j] = q[r] · k[j] for r < R (R = 1, 2 or 4), j over the runs' keys in order;
//         // may request the next block's K rows through `next` (Lookahead, below)
//   static float row_max(const float* s, int64 n);   // max_j s[j] (−inf when n = 0)
//   static float exp_shift(float* s, int64 n, float m);
//         // s[j] ← e^(s[j] − m) = 2^x, x = (s[j] − m)·log2 e, exactly 0 where s[j] = −inf
//         // and where x < kWeightFloor (kept_exponent, below); returns Σ_j s[j]
//   static float exp2_1(float x);   // 2^x, the ISA's exp2 on one value
//   template <class T> static void accumulate(float* o, int64 ostride, const float* alpha,
//       const float* p, int64 pstride, int R, const KeyRun<T>* v, int nruns, int64 vstride, int64 Dv,
//       Lookahead<T>& next);
//         // o[r] ← alpha[r]·o[r] + Σ_j p[r][j]·v[j], j over the runs' keys in order, the
//         // accumulators kept in registers across the runs; may request the next block's V rows
// and the storage tags Half / Brain (16-bit float16 / bfloat16 payloads).
//
// Scores are in natural units (Q is pre-multiplied by scale; scores.hpp says why not base
// 2); every exponential is the ISA's exp2 of a difference times log2 e (simd/exp2.hpp);
// the score rule (scores.hpp) applies the masks and the key interval. A NaN/±inf in V at
// a key some row gives weight 0 takes the selecting path of kernels/finite.hpp. A work item
// whose accumulator ends non-finite (Σ p·v overflowed on large finite V, or a visible
// NaN/±inf) is computed again on finite.hpp's careful path; split partials are stored
// normalised (o/l) so that merging them is a weighted mean, which cannot overflow either.
#pragma once

#include <math.h>  // expf, logf, INFINITY: C functions, no inline C++ wrappers (see above)
#include <omp.h>

#include <cstdint>

#include "../../core/float_env.hpp"
#include "../../sdpa/problem.hpp"
#include "../finite.hpp"
#include "../scores.hpp"
#include "../store_row.hpp"
#include "decode.hpp"

namespace attn::detail {
namespace {

using i64 = std::int64_t;

inline i64 imin(i64 a, i64 b) { return a < b ? a : b; }
inline i64 imax(i64 a, i64 b) { return a > b ? a : b; }

constexpr float kLog2e = 1.4426950408889634f;

// The smallest weight a key keeps, as a power of 2 relative to the row's running max: a weight
// 2^x with x < kWeightFloor is 0 (Ops::exp_shift), and so is the rescale α of the accumulator
// (run_item). Why: attn computes with IEEE subnormals (core/float_env.hpp), and on Intel cores a
// vector FMA with a subnormal result or operand is slow (a microcode assist, most likely). A
// weight in [2^-126, 2^-100] times a V entry of order 1 is subnormal, and with ALiBi every
// 256-key block of a steep head (slopes to 0.84 per key) walks its weights down through that
// range: S5 float16 with sinks + ALiBi took 1.04–1.07× the plain step, all of it in P·V's FMAs,
// and 1.00–1.01× with the floor (S7 float16 1.16× → 1.02×; docs/kernels-lab.md#dec-13). A dropped
// key weighs < 2^-64 against the running max's key (weight 1, so l ≥ 1): out moves by
// < 2·Lk·2^-64·max|V|, lse by < Lk·2^-64 — far inside docs/conventions.md's bounds. V entries below 2^-62 in
// magnitude can still give subnormal products: correct, only slower.
constexpr float kWeightFloor = -64.0f;

// x, or −inf (weight 0) where 2^x falls below the floor; NaN passes.
inline float kept_exponent(float x) { return x < kWeightFloor ? -INFINITY : x; }

// The problem's pointers and element strides, read once per call (decode_impl).
struct DecodeView {
    i64 B, Hq, Hkv, Lq, Lk, Dk, Dv, group;
    float qscale;  // scale
    const void* q;  // float32, float16 or bfloat16 (qtype)
    DType qtype;
    i64 qs[4];
    const void* k;
    i64 ks[4];
    const void* v;
    i64 vs[4];
    const TensorView* out;  // float32, float64, float16 or bfloat16: written by store_row
    i64 os[4];
    const TensorView* lse;  // float32 or float64; null when not requested
    i64 ls[3];
};

inline DecodeView view_of(const SdpaProblem& p) {
    DecodeView a{p.B, p.Hq, p.Hkv, p.Lq, p.Lk, p.Dk, p.Dv, p.group, static_cast<float>(p.scale),
                 p.q.data(), p.q.dtype(), {}, p.k.data(), {}, p.v.data(), {}, &p.out, {},
                 nullptr, {}};
    for (int d = 0; d < 4; ++d) {
        a.qs[d] = p.q.stride(d);
        a.ks[d] = p.k.stride(d);
        a.vs[d] = p.v.stride(d);
        a.os[d] = p.out.stride(d);
    }
    if (p.lse) {
        a.lse = &*p.lse;
        for (int d = 0; d < 3; ++d) a.ls[d] = p.lse->stride(d);
    }
    return a;
}

// Scratch of one thread, carved from args.work. M = group·Lq rows.
struct Scratch {
    float* q;      // M × Dk: the rows' queries, pre-multiplied by scale
    float* s;      // M × kDecodeBlock: scores, then probabilities, of the current block
    float* o;      // M × Dv: unnormalised output accumulator
    float* m;      // M: running max of the scaled scores
    float* l;      // M: running Σ exp(score − m)
    float* alpha;  // M: rescale factor of the current block
    float* vt;     // kDecodeBlock × Dv: V block with non-finite (careful path: and large) entries 0
    float* ob;     // M × Dv: careful path: accumulator of V's large entries, scaled by 2^-64
    float* vb;     // kDecodeBlock × Dv: careful path: V's large entries scaled by 2^-64, others 0
    i64* lo;       // M: visible key range of the row, clipped to the chunk
    i64* hi;
};

inline i64 scratch_floats(i64 M, i64 Dk, i64 Dv) {
    // q, s, o, m, l, alpha, vt, ob, vb, and lo/hi as two i64 (= 2 floats each) per row.
    return M * Dk + M * kDecodeBlock + M * Dv + 3 * M + kDecodeBlock * Dv + M * Dv + kDecodeBlock * Dv + 4 * M + 16;
}

inline Scratch carve(float* base, i64 M, i64 Dk, i64 Dv) {
    Scratch s;
    s.q = base;
    s.s = s.q + M * Dk;
    s.o = s.s + M * kDecodeBlock;
    s.m = s.o + M * Dv;
    s.l = s.m + M;
    s.alpha = s.l + M;
    s.vt = s.alpha + M;
    s.ob = s.vt + kDecodeBlock * Dv;
    s.vb = s.ob + M * Dv;
    // i64 arrays need 8-byte alignment: round the offset up to an even float count.
    i64 off = (s.vb + kDecodeBlock * Dv) - base;
    off = (off + 1) & ~i64{1};
    s.lo = reinterpret_cast<i64*>(base + off);
    s.hi = s.lo + M;
    return s;
}

// Calls f(r0, R) over the rows 0..M−1 in groups of 4, then 2, then 1.
template <class F>
inline void for_row_groups(i64 M, F&& f) {
    i64 r = 0;
    for (; r + 4 <= M; r += 4) f(r, 4);
    for (; r + 2 <= M; r += 2) f(r, 2);
    for (; r < M; ++r) f(r, 1);
}

// Bytes of the next page's K and V requested ahead on a fragmented pool (for_key_runs).
constexpr i64 kPageLead = 1024;

// Key-row addressing: rows [j0, j0 + n) of sequence b, KV head hk, as runs of rows at one
// row stride (a.ks[2] / a.vs[2]) — one run for K/V views; for a paged cache (w.paged) one
// run per stretch of pages that lie one after the other in the pool (a page followed by
// the next page of the pool joins its run: in-order pages read exactly as contiguous K/V,
// and the run list stays short). f(t, len, krow, vrow): rows
// j0 + t .. j0 + t + len − 1 start at krow / vrow. Scores are per key and P·V sums each
// output element over the keys in order, so a block split into runs gives the same bits as
// the block in one piece (paged == contiguous).
template <class T, class F>
inline void for_key_runs(const DecodeView& a, const DecodeWork& w, i64 b, i64 hk, i64 j0, i64 n, F&& f) {
    const T* k = static_cast<const T*>(a.k) + hk * a.ks[1];
    const T* v = static_cast<const T*>(a.v) + hk * a.vs[1];
    if (w.paged == nullptr) {
        f(i64{0}, n, k + b * a.ks[0] + j0 * a.ks[2], v + b * a.vs[0] + j0 * a.vs[2]);
        return;
    }
    const PagedRows& pg = *w.paged;
    const std::int32_t* table = pg.table + b * pg.table_stride;
    // Pages join only when a page's rows continue at the row stride into the next page.
    const bool joinable = pg.k_page_stride == pg.page_size * a.ks[2] && pg.v_page_stride == pg.page_size * a.vs[2];
    for (i64 t = 0; t < n;) {
        const i64 j = j0 + t, slot = j >> pg.page_shift, page = table[slot], row = j & (pg.page_size - 1);
        i64 end = imin(n, t + pg.page_size - row), last = slot;  // last: the run's last slot
        // Keys past `end` in the block lie in slot last + 1 (< the sequence's page count).
        while (joinable && end < n && table[last + 1] == table[last] + 1) {
            ++last;
            end = imin(n, end + pg.page_size);
        }
        // A run that ends at a page whose successor is not the next page of the pool: request
        // the start of the successor's K and V (kPageLead bytes each), so the hardware
        // prefetcher, which stops at the gap, finds that stream already started (fragmented
        // pools). A prefetch never faults, so a page shorter than kPageLead needs no clamp.
        const bool to_page_end = j0 + end == (last + 1) << pg.page_shift;
        if (to_page_end && last + 1 < pg.table_stride && table[last + 1] != table[last] + 1) {
            const char* nk = reinterpret_cast<const char*>(k + table[last + 1] * pg.k_page_stride);
            const char* nv = reinterpret_cast<const char*>(v + table[last + 1] * pg.v_page_stride);
            for (i64 x = 0; x < kPageLead; x += 64) {
                __builtin_prefetch(nk + x, 0, 3);
                __builtin_prefetch(nv + x, 0, 3);
            }
        }
        f(t, end - t, k + page * pg.k_page_stride + row * a.ks[2], v + page * pg.v_page_stride + row * a.vs[2]);
        t = end;
    }
}

// One run of a block's key rows, as the Ops kernels take them: n rows at the caller's row
// stride from `rows`. A block's runs follow each other: run x holds the block's keys after
// those of runs 0 .. x−1.
template <class T>
struct KeyRun {
    const T* rows;
    i64 n;
};

// The K and V runs of one block of at most kDecodeBlock keys (for_key_runs, walked once per
// block): the Ops take the whole list in one call, so an accumulator is loaded, rescaled and
// stored once per block and row, not once per page run (fragmented pools: one run per page).
template <class T>
struct BlockRuns {
    KeyRun<T> k[kDecodeBlock], v[kDecodeBlock];
    int count = 0;
};

template <class T>
inline void collect_runs(const DecodeView& a, const DecodeWork& w, i64 b, i64 hk, i64 j0, i64 n, BlockRuns<T>& out) {
    out.count = 0;
    for_key_runs<T>(a, w, b, hk, j0, n, [&](i64, i64 len, const T* krow, const T* vrow) {
        out.k[out.count] = KeyRun<T>{krow, len};
        out.v[out.count] = KeyRun<T>{vrow, len};
        ++out.count;
    });
}

// The next block's K (or V) rows as a stream of cache lines, requested a few at a time by the
// score (or P·V) loop of the current block: `step(n)` prefetches the stream's next n lines.
// Used where a key costs much more compute than its bytes take to arrive — a GQA group, whose
// R rows each spend 2·D FMAs on the key: there the hardware prefetchers, which run only a
// little ahead of the demand loads, left each core alternating between computing and waiting
// (one thread, S7 float16 from memory 6.1–7.9 → 4.0–4.2 ms per step; docs/kernels-lab.md, "Decode:
// requesting the next block"). The loop calls step() at the rate it consumes the current
// block (one row's lines per key; ahead_lines for rows one at a time), so the stream is one
// block ahead and ends with the block; where memory is the bound anyway (one row per KV head,
// S5) the same requests only compete with the demand loads (S5 float32 measured slower), so
// those tiles do not call it.
template <class T>
struct Lookahead {
    const KeyRun<T>* run = nullptr;  // the run being requested, and the runs after it
    const KeyRun<T>* end = nullptr;
    const char* row = nullptr;  // the next row's first byte
    i64 rows_left = 0, line = 0, row_lines = 0, stride = 0;  // stride: bytes between rows

    Lookahead() = default;
    // The rows of `runs` (row_bytes each, stride_elems elements apart); empty when n = 0.
    Lookahead(const KeyRun<T>* runs, int n, i64 stride_elems, i64 row_bytes)
        : run(runs), end(runs + n), row_lines((row_bytes + 63) / 64),
          stride(stride_elems * static_cast<i64>(sizeof(T))) {
        start_run();
    }
    void start_run() {
        for (; run != end && run->n == 0; ++run) {}
        if (run == end) return;
        row = reinterpret_cast<const char*>(run->rows);
        rows_left = run->n;
        line = 0;
    }
    void step(i64 n) {
        while (n > 0 && run != end) {
            const i64 k = imin(n, row_lines - line);  // the rest of this row's lines, at most n
            for (i64 x = 0; x < k; ++x) __builtin_prefetch(row + 64 * (line + x), 0, 2);
            n -= k;
            line += k;
            if (line < row_lines) return;
            line = 0;
            if (--rows_left == 0) {
                ++run;
                start_run();
            } else {
                row += stride;  // only to a row that exists: a size-1 dimension's stride may be anything
            }
        }
    }
};

// Start of every 4 KiB page that begins inside the span of n rows (row_bytes each,
// stride_bytes apart): its first kPageHeadLines lines are requested. The hardware prefetchers
// follow a stream only inside a 4 KiB page and must see a few demand misses in each new page
// before they run ahead; a step reads K and V of a block alternately (128 KiB each for float32
// at D = 128: 32 page starts each), so a core stalls at every page start. Requesting the page
// heads of the stream it reads next (this block's V during the scores, the next block's K
// during P·V) starts them early: single-thread CPU time per S5 step (512 MiB float32) fell
// ≈ 20 % (docs/kernels-lab.md, "Decode: rows one at a time, page-head prefetch"). About one
// prefetch per 4 keys at D = 128 float32; same bits. A paged cache gets the same requests run by run (a 4 KiB page
// start inside each cache page).
// Rows more than a page apart (or a zero or negative stride) are no stream: the pages between
// them are not read, so only each row's own first lines are requested. The span rule would
// walk every page up to n·stride — for a size-1 dimension's arbitrary stride, billions of
// pages (the fuzzer's hang, fuzz/corpus/fuzz_array/regress-decode-huge-stride-*).
constexpr int kPageHeadLines = 2;

inline void prefetch_page_heads(const void* p, i64 n, i64 stride_bytes, i64 row_bytes) {
    constexpr i64 kPage = 4096;
    const char* const first = static_cast<const char*>(p);
    if (n <= 0) return;
    if (stride_bytes <= 0 || stride_bytes > kPage) {
        for (i64 r = 0; r < (stride_bytes == 0 ? 1 : n); ++r)
            for (int l = 0; l < kPageHeadLines && 64 * l < row_bytes; ++l)
                __builtin_prefetch(first + r * stride_bytes + 64 * l, 0, 3);
        return;
    }
    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(first);
    const std::uintptr_t end = begin + static_cast<std::uintptr_t>((n - 1) * stride_bytes + row_bytes);
    for (std::uintptr_t x = (begin + kPage - 1) & ~std::uintptr_t(kPage - 1); x < end; x += kPage)
        for (int l = 0; l < kPageHeadLines; ++l) __builtin_prefetch(reinterpret_cast<const char*>(x + 64 * l), 0, 3);
}

// A GQA group's rows one at a time (the avx2 row's P·V: R rows of a whole head-dim row do not
// fit its 16 registers): how many of the next block's lines each row's pass requests per
// `lines` of this block it reads — a 1/R share, so the R passes together request the next
// block once and the memory works while the rows compute. Only the first pass reads the block
// from memory, the other R − 1 reread it from L2; without the requests the core alternated
// (docs/kernels-lab.md, "Decode: float32 groups together"). R = 1 requests nothing (Lookahead).
inline i64 ahead_lines(i64 lines, int R) { return R > 1 ? (lines + R - 1) / R : 0; }

// Ops::scores of the vector rows (decode_avx2.cpp, decode_avx512.cpp), on their tiles
// Ops::score_tile<T, KS>(q, k, kstride, n, Dk, s) (one row × 8 keys) and
// Ops::score_tile_rows<R, T>(q, qstride, k, kstride, n, Dk, s, sstride, next) (R rows × 8/R keys,
// requesting the next block's K: Lookahead).
// A GQA group's rows (R = 2 or 4) together: each K vector is loaded and converted once for
// them, where rows one at a time converted 16-bit K again per row (docs/kernels-lab.md, "Decode:
// key-major score tiles") and reread a float32 block from L2 per row ("Decode: float32 groups
// together"). One row (R = 1) reads whole K rows in address order (docs/kernels-lab.md, "Decode:
// rows one at a time"), row strides of 128 and 64 elements (contiguous caches and pages at those head dims)
// reaching the tile as a compile-time constant. A paged block's runs (one per page of a
// fragmented pool) one after the other. Same bits either way: every dot product keeps its order.
// R is 1, 2 or 4 (for_row_groups).
template <class Ops, class T>
inline void vector_scores(const float* q, i64 qstride, int R, const KeyRun<T>* k, int nruns, i64 kstride, i64 Dk,
                          float* s, i64 sstride, Lookahead<T>& next) {
    if (R == 4 || R == 2) {
        for (int x = 0; x < nruns; s += k[x].n, ++x) {
            if (R == 4) Ops::template score_tile_rows<4, T>(q, qstride, k[x].rows, kstride, k[x].n, Dk, s, sstride, next);
            else Ops::template score_tile_rows<2, T>(q, qstride, k[x].rows, kstride, k[x].n, Dk, s, sstride, next);
        }
        return;
    }
    for (int x = 0; x < nruns; s += k[x].n, ++x) {
        const T* kr = k[x].rows;
        const i64 n = k[x].n;
        if (kstride == 128) Ops::template score_tile<T, 128>(q, kr, kstride, n, Dk, s);
        else if (kstride == 64) Ops::template score_tile<T, 64>(q, kr, kstride, n, Dk, s);
        else Ops::template score_tile<T>(q, kr, kstride, n, Dk, s);
    }
}

// Element x of Q as float32 (a 16-bit Q through the Ops' loaders): M·Dk loads per item,
// against the item's Lk·(Dk+Dv) K/V loads.
template <class Ops>
inline float load_q(const DecodeView& a, i64 x) {
    switch (a.qtype) {
        case DType::f16: return Ops::load1(static_cast<const typename Ops::Half*>(a.q) + x);
        case DType::bf16: return Ops::load1(static_cast<const typename Ops::Brain*>(a.q) + x);
        default: return static_cast<const float*>(a.q)[x];
    }
}

// Step 1 of the score rule (scores.hpp's apply_score_modifiers) on one row's block of keys
// [j0, j0+n), stride 1, as loops this file's ISA vectorises: softcap through softcap_f32,
// then ALiBi −m·|d − j| with the distance in float from abase = d − j0 (flash's
// tile_modifiers does the same) — exact, so the same bits as the int64 path, while
// |d − j0| + n <= 2^24; past that (offsets or lengths beyond 16 M) apply_alibi's int64 path.
// No abs() or int64 conversion per key: a convert, a subtract, an and and an FMA per 16 keys.
inline void block_modifiers(const SdpaProblem& p, i64 b, i64 h, i64 i, i64 j0, i64 n, float* s) {
    if (p.softcap > 0.0) {
        softcap_f32(s, 1, n, static_cast<float>(p.softcap), static_cast<float>(1.0 / p.softcap), nullptr);
    }
    if (!p.alibi_slopes) return;
    constexpr i64 kExact = i64{1} << 24;
    const i64 rel = i + p.alibi_offset(b) - j0;
    if ((rel < 0 ? -rel : rel) + n > kExact) {
        apply_alibi<float>(p, b, h, i, j0, n, s, 1);
        return;
    }
    const float m = p.alibi_slope(b, h), abase = static_cast<float>(rel);
    const int nn = static_cast<int>(n);
    for (int j = 0; j < nn; ++j) s[j] -= m * fabsf(abase - static_cast<float>(j));
}

// One body of run_item for both of an item's passes (decode_impl): the careful pass must give
// the clean pass's m and l (so lse) and, to the rows whose V entries it reads are all ordinary,
// its o, bit for bit (DecodeKernel.CarefulPassKeepsTheCleanPassBits). GCC fuses a product and
// the sum that consumes it into one FMA in some inlined copies of a function and not in others
// (docs/conventions.md, "Numerics and threads"): two copies of run_item — inlined into each
// pass, or cloned for careful = false and true — could round a site differently, as l = α·l +
// Σp once did. noinline and noclone leave one body per <Ops, T> that both passes run, `careful`
// a run-time flag, so every site is the same instructions in both. (GCC kept run_item out of
// line and unspecialised by itself — the attributes change no instruction —; now it is a rule.
// The call costs nothing next to an item's keys.) Clang fuses within one expression only.
#if defined(__clang__)
#define ATTN_DECODE_ONE_BODY __attribute__((noinline))
#else
#define ATTN_DECODE_ONE_BODY __attribute__((noinline, noclone))
#endif

// One work item: sequence b, KV head hk, keys [c0, c1). Leaves (o, m, l) per row in sc
// (careful: and ob, the large part; finite.hpp).
template <class Ops, class T>
ATTN_DECODE_ONE_BODY void run_item(const SdpaProblem& p, const DecodeView& a, const DecodeWork& w, i64 b, i64 hk,
                                   i64 c0, i64 c1, const Scratch& sc, bool careful) {
    const i64 G = a.group, Lq = a.Lq, M = G * Lq, Dk = a.Dk, Dv = a.Dv;
    // Row r = g·Lq + i is query i of query head h = hk·G + g.
    i64 klo = c1, khi = c0;
    for (i64 r = 0; r < M; ++r) {
        const i64 g = r / Lq, i = r % Lq, h = hk * G + g;
        const i64 qrow = b * a.qs[0] + h * a.qs[1] + i * a.qs[2];
        for (i64 d = 0; d < Dk; ++d) sc.q[r * Dk + d] = load_q<Ops>(a, qrow + d * a.qs[3]) * a.qscale;
        const i64* rg = w.range + 2 * (b * Lq + i);
        sc.lo[r] = imax(rg[0], c0);
        sc.hi[r] = imin(rg[1], c1);
        if (sc.lo[r] < sc.hi[r]) {
            klo = imin(klo, sc.lo[r]);
            khi = imax(khi, sc.hi[r]);
        }
        // A sink is one more logit with value 0 (scores.hpp), counted once: by the first chunk.
        const bool sink = p.sinks && c0 == 0;
        sc.m[r] = sink ? p.sink(h) : -INFINITY;
        sc.l[r] = sink ? 1.0f : 0.0f;
        for (i64 d = 0; d < Dv; ++d) sc.o[r * Dv + d] = 0.0f;
        if (careful)
            for (i64 d = 0; d < Dv; ++d) sc.ob[r * Dv + d] = 0.0f;
    }
    const bool masks = p.has_elementwise_mask(), modifiers = p.has_score_modifiers();
    const std::uint16_t exp16 = p.v.dtype() == DType::f16 ? kF16Exponent : kBF16Exponent;

    // The block's runs, and the next block's (its K is requested during this block).
    BlockRuns<T> runs[2];
    int cur = 0;
    const i64 blk = decode_block(M);  // ≤ kDecodeBlock (the scratch's size); also the score rows' stride
    if (klo < khi) collect_runs<T>(a, w, b, hk, klo, imin(blk, khi - klo), runs[cur]);
    for (i64 j0 = klo; j0 < khi; j0 += blk, cur ^= 1) {
        const i64 n = imin(blk, khi - j0);
        const BlockRuns<T>& br = runs[cur];
        Lookahead<T> next_k, next_v;  // the next block's rows, for the tiles that request them
        {  // this block's V and the next block's K, run by run (one run, or one per cache page)
            const i64 n_next = imin(blk, khi - (j0 + n));
            for (int x = 0; x < br.count; ++x)
                prefetch_page_heads(br.v[x].rows, br.v[x].n, a.vs[2] * static_cast<i64>(sizeof(T)),
                                    Dv * static_cast<i64>(sizeof(T)));
            if (n_next > 0) {
                BlockRuns<T>& next = runs[cur ^ 1];
                collect_runs<T>(a, w, b, hk, j0 + n, n_next, next);
                for (int x = 0; x < next.count; ++x)
                    prefetch_page_heads(next.k[x].rows, next.k[x].n, a.ks[2] * static_cast<i64>(sizeof(T)),
                                        Dk * static_cast<i64>(sizeof(T)));
                next_k = Lookahead<T>(next.k, next.count, a.ks[2], Dk * static_cast<i64>(sizeof(T)));
                next_v = Lookahead<T>(next.v, next.count, a.vs[2], Dv * static_cast<i64>(sizeof(T)));
            }
        }
        // S = (scale·Q) · K_blockᵀ — each K row is read from memory once for all M rows.
        for_row_groups(M, [&](i64 r0, i64 R) {
            Ops::template scores<T>(sc.q + r0 * Dk, Dk, static_cast<int>(R), br.k, br.count, a.ks[2], Dk,
                                    sc.s + r0 * blk, blk, next_k);
        });
        // Online softmax (per row, base 2):  m' = max(m, max_j s_j);  α = 2^(m − m');
        //   p_j = 2^(s_j − m');  l' = α·l + Σ_j p_j;  o' = α·o + Σ_j p_j·v_j   (below)
        bool ruled = false;  // some row has weights exactly 0 in this block
        for (i64 r = 0; r < M; ++r) {
            float* s = sc.s + r * blk;
            // The score rule: the modifiers on every block (vectorised, block_modifiers), the
            // masks and the key interval unless the row sees this whole block and has no mask.
            // Only the masks give weights exactly 0 (softcap and ALiBi keep a finite score
            // finite), so only they send V to the non-finite scan below.
            if (modifiers) block_modifiers(p, b, hk * G + r / Lq, r % Lq, j0, n, s);
            if (masks || sc.lo[r] > j0 || sc.hi[r] < j0 + n) {
                apply_mask_rule(p, b, hk * G + r / Lq, r % Lq, j0, n, s, 1, KeyRange{sc.lo[r], sc.hi[r]});
                ruled = true;
            }
            const float mx = Ops::row_max(s, n);
            const float m_new = mx > sc.m[r] ? mx : sc.m[r];
            if (m_new == -INFINITY) {
                // Nothing finite visible yet: p = 0 for −inf, NaN for a NaN score (row_max
                // skips NaN, which must still reach l and o); m stays −inf.
                sc.alpha[r] = 1.0f;
                sc.l[r] += Ops::exp_shift(s, n, 0.0f);
                continue;
            }
            // 2^(−inf) = 0 on the first visible block; 0 too below the floor (kWeightFloor)
            sc.alpha[r] = Ops::exp2_1(kept_exponent((sc.m[r] - m_new) * kLog2e));
            // An explicit fma: left to contraction (GCC's default -ffp-contract=fast), the
            // product and the sum were fused in some of run_item's inlined copies and not in
            // others, so the same scores gave lse 1 ulp apart between the clean pass and the
            // careful one (NonFinite.DecodeEveryRowAndSplit) once the score code moved.
            sc.l[r] = __builtin_fmaf(sc.alpha[r], sc.l[r], Ops::exp_shift(s, n, m_new));
            sc.m[r] = m_new;
        }
        // O = α·O + P · V_block — each V row is read from memory once for all M rows.
        bool select = careful;
        if (ruled && !careful) {
            for (int x = 0; x < br.count && !select; ++x) {
                if (sizeof(T) == sizeof(float)) {
                    select = any_nonfinite(reinterpret_cast<const float*>(br.v[x].rows), a.vs[2], br.v[x].n, Dv);
                } else {
                    select = any_nonfinite16(reinterpret_cast<const std::uint16_t*>(br.v[x].rows), a.vs[2], br.v[x].n,
                                             Dv, exp16);
                }
            }
        }
        if (!select) {
            for_row_groups(M, [&](i64 r0, i64 R) {
                Ops::template accumulate<T>(sc.o + r0 * Dv, Dv, sc.alpha + r0, sc.s + r0 * blk, blk,
                                            static_cast<int>(R), br.v, br.count, a.vs[2], Dv, next_v);
            });
        } else {
            // Selecting path (finite.hpp): P·V on V with its NaN/±inf entries 0, then each
            // of them added back as p·x to the rows whose weight p is not 0. Careful path:
            // the large entries are 0 there too and summed, scaled, into ob.
            for (int x = 0, t = 0; x < br.count; t += static_cast<int>(br.v[x].n), ++x) {
                const T* vrow = br.v[x].rows;
                for (i64 j = 0; j < br.v[x].n; ++j)
                    for (i64 d = 0; d < Dv; ++d) {
                        const float xv = Ops::load1(vrow + j * a.vs[2] + d);
                        float& ordinary = sc.vt[(t + j) * Dv + d];
                        if (careful) split_large(xv, ordinary, sc.vb[(t + j) * Dv + d]);
                        else ordinary = nonfinite_f32(xv) ? 0.0f : xv;
                    }
            }
            const KeyRun<float> vt{sc.vt, n}, vb{sc.vb, n};
            Lookahead<float> none;
            for_row_groups(M, [&](i64 r0, i64 R) {
                Ops::template accumulate<float>(sc.o + r0 * Dv, Dv, sc.alpha + r0, sc.s + r0 * blk,
                                                blk, static_cast<int>(R), &vt, 1, Dv, Dv, none);
                if (careful)
                    Ops::template accumulate<float>(sc.ob + r0 * Dv, Dv, sc.alpha + r0, sc.s + r0 * blk,
                                                    blk, static_cast<int>(R), &vb, 1, Dv, Dv, none);
            });
            for (int x = 0, t = 0; x < br.count; t += static_cast<int>(br.v[x].n), ++x) {
                const T* vrow = br.v[x].rows;
                for (i64 j = 0; j < br.v[x].n; ++j)
                    for (i64 d = 0; d < Dv; ++d) {
                        const float xv = Ops::load1(vrow + j * a.vs[2] + d);
                        if (!nonfinite_f32(xv)) continue;
                        for (i64 r = 0; r < M; ++r) {
                            const float pr = sc.s[r * blk + t + j];
                            if (pr != 0.0f) sc.o[r * Dv + d] += pr * xv;
                        }
                    }
            }
        }
    }
}

// o / l of one row, in place, from the item's accumulators (careful: with the large part ob).
// l = 0 (no visible key): 0; l NaN (a NaN/±inf score): NaN.
inline void normalise_row(float* o, const float* ob, float l, i64 Dv, bool careful) {
    const float inv = l == 0.0f ? 0.0f : 1.0f / l;
    for (i64 d = 0; d < Dv; ++d) o[d] = careful ? combine_large(o[d], ob[d], inv, true) : o[d] * inv;
}

// Final output of one row from its normalised o (o / l) and (m, l): lse = m + ln l.
// A row that saw no key (l = 0) gives out = 0, lse = −inf (never NaN); a row that saw a
// NaN/±inf score (l NaN) gives NaN in both.
// out in its dtype through store_row (the flash kernel's too): 16-bit rounds the float32 value once.
inline void write_row(const DecodeView& a, i64 b, i64 h, i64 i, float* o, float m, float l) {
    const bool empty = l == 0.0f;
    if (empty)
        for (i64 d = 0; d < a.Dv; ++d) o[d] = 0.0f;
    const float f = l == l ? 1.0f : NAN;  // a merged row whose NaN came from a chunk it skipped
    store_row(*a.out, b * a.os[0] + h * a.os[1] + i * a.os[2], a.os[3], o, 1, a.Dv, f);
    if (a.lse != nullptr) {
        const float lse = empty ? -INFINITY : m + logf(l);
        const i64 at = b * a.ls[0] + h * a.ls[1] + i * a.ls[2];
        if (a.lse->dtype() == DType::f32) a.lse->data_as<float>()[at] = lse;
        else a.lse->data_as<double>()[at] = static_cast<double>(lse);
    }
}

template <class Ops, class T>
void decode_impl(const SdpaProblem& p, const DecodeWork& w) {
    const DecodeView a = view_of(p);
    const i64 M = a.group * a.Lq, Dk = a.Dk, Dv = a.Dv;
    const i64 items = a.B * a.Hkv * w.nsplit;
    const i64 part_stride = M * Dv + 2 * M;  // o (M × Dv), m (M), l (M) of one item

#pragma omp parallel num_threads(w.max_threads)
    {
        const IeeeSubnormals ieee;  // each thread with IEEE subnormals (core/float_env.hpp)
        const Scratch sc = carve(w.work + omp_get_thread_num() * w.work_per_thread, M, Dk, Dv);
#pragma omp for schedule(dynamic, 1)
        for (i64 it = 0; it < items; ++it) {
            if (w.interrupt->requested()) continue;
            const i64 c = it % w.nsplit, bh = it / w.nsplit;
            const i64 b = bh / a.Hkv, hk = bh % a.Hkv;
            const i64 c0 = c * w.chunk, c1 = imin(a.Lk, c0 + w.chunk);
            run_item<Ops, T>(p, a, w, b, hk, c0, c1, sc, false);
            // Σ p·v overflowed (large finite V) or a visible NaN/±inf: again, carefully.
            const bool careful = any_nonfinite(sc.o, Dv, M, Dv);
            if (careful) run_item<Ops, T>(p, a, w, b, hk, c0, c1, sc, true);
            for (i64 r = 0; r < M; ++r) normalise_row(sc.o + r * Dv, sc.ob + r * Dv, sc.l[r], Dv, careful);
            if (w.nsplit == 1) {
                for (i64 r = 0; r < M; ++r)
                    write_row(a, b, hk * a.group + r / a.Lq, r % a.Lq, sc.o + r * Dv, sc.m[r], sc.l[r]);
            } else {
                float* part = w.partial + it * part_stride;
                for (i64 x = 0; x < M * Dv; ++x) part[x] = sc.o[x];
                for (i64 r = 0; r < M; ++r) {
                    part[M * Dv + r] = sc.m[r];
                    part[M * Dv + M + r] = sc.l[r];
                }
            }
        }
        if (w.nsplit > 1) {
            // Merge the chunks of each (b, hk) by their log-sum-exp (base 2), in chunk order:
            // l = Σ_c w_c·l_c, out = Σ_c (w_c·l_c / l)·(o_c / l_c) — a weighted mean of the
            // normalised partials (weights summing to 1), so large V cannot overflow it.
#pragma omp for schedule(static)
            for (i64 bh = 0; bh < a.B * a.Hkv; ++bh) {
                if (w.interrupt->requested()) continue;  // (a skipped item left its partial unwritten)
                const i64 b = bh / a.Hkv, hk = bh % a.Hkv;
                const float* parts = w.partial + bh * w.nsplit * part_stride;
                for (i64 r = 0; r < M; ++r) {
                    float mmax = -INFINITY;
                    for (i64 c = 0; c < w.nsplit; ++c) {
                        const float mc = parts[c * part_stride + M * Dv + r];
                        mmax = mc > mmax ? mc : mmax;
                    }
                    float* o = sc.o;  // reuse the thread's accumulator for the merged row
                    for (i64 d = 0; d < Dv; ++d) o[d] = 0.0f;
                    float l = 0.0f;
                    for (i64 c = 0; c < w.nsplit; ++c) {
                        const float* pc = parts + c * part_stride;
                        const float mc = pc[M * Dv + r];
                        if (mc == -INFINITY) {
                            // The chunk saw no finite score of this row: l_c is 0 (nothing
                            // visible) or NaN (a NaN score), which must reach the row.
                            if (pc[M * Dv + M + r] != 0.0f) l = pc[M * Dv + M + r];
                            continue;
                        }
                        // Explicit fmas here and below, as for l in run_item: contraction is
                        // the compiler's choice per inlined copy, and the float32 and 16-bit
                        // instantiations must merge the same partials to the same bits.
                        l = __builtin_fmaf(Ops::exp2_1((mc - mmax) * kLog2e), pc[M * Dv + M + r], l);
                    }
                    const float inv = l == 0.0f ? 0.0f : 1.0f / l;
                    for (i64 c = 0; c < w.nsplit; ++c) {
                        const float* pc = parts + c * part_stride;
                        const float mc = pc[M * Dv + r];
                        if (mc == -INFINITY) continue;
                        const float f = Ops::exp2_1((mc - mmax) * kLog2e) * pc[M * Dv + M + r] * inv;
                        for (i64 d = 0; d < Dv; ++d) o[d] = __builtin_fmaf(f, pc[r * Dv + d], o[d]);
                    }
                    // A mean of finite partials that rounded past FLT_MAX (finite.hpp, saturate_mean).
                    for (i64 d = 0; d < Dv; ++d) {
                        if (!nonfinite_f32(o[d]) || l != l) continue;
                        bool finite_parts = true;
                        for (i64 c = 0; c < w.nsplit; ++c) {
                            const float* pc = parts + c * part_stride;
                            if (pc[M * Dv + r] != -INFINITY) finite_parts = finite_parts && !nonfinite_f32(pc[r * Dv + d]);
                        }
                        if (finite_parts) o[d] = saturate_mean(o[d]);
                    }
                    write_row(a, b, hk * a.group + r / a.Lq, r % a.Lq, o, mmax, l);
                }
            }
        }
    }
}

template <class Ops>
void decode_entry(const SdpaProblem& p, const DecodeWork& w) {
    switch (p.k.dtype()) {
        case DType::f16: decode_impl<Ops, typename Ops::Half>(p, w); break;
        case DType::bf16: decode_impl<Ops, typename Ops::Brain>(p, w); break;
        default: decode_impl<Ops, float>(p, w); break;
    }
}

}  // namespace
}  // namespace attn::detail
