// The AVX-512 flash path. This file alone (of the flash kernel) is compiled with
// ATTN_AVX512_FLAGS (src/CMakeLists.txt: ATTN_AVX512_SOURCES); it is reached only through
// the kernel table (isa.cpp), whose avx512 row is used only on a CPU that has AVX-512
// F+VL+BW+DQ with OS-saved ZMM state.
//
// Micro-kernels: 8 rows × 32 queries — a 32-query panel is 2 zmm, so each row has two
// accumulators: 16 accumulators + the 2 panel vectors of 32 zmm; per inner step 2 vector loads
// and 16 FMAs whose K/V operand is one scalar per row, broadcast straight from memory (the
// {1to16} embedded-broadcast form: no shuffle uop, no broadcast register), each used twice.
// Measured hot in L1 on Zen 5 (docs/kernels-lab.md, "The tile and block sizes"): 16 rows × 1 zmm
// (16 queries, the first version) ran at 52–59 % of the register-only FMA loop, 32 queries ×
// 8/12/14 rows at 61–65 %: half the broadcasts per FMA. 8 rows divide the usual head dims
// (64, 128) and the 64-key block, so pv has no ragged tile; 12 or 14 rows measured the same and
// would leave one.
// Two adjacent panels (every full 64-query block) run as one 6 rows × 64 queries tile instead
// (qk_pair, pv_pair; the driver's kOpsPanelPairs): 24 accumulators + 4 panel vectors + 1
// broadcast of 32 zmm, 4 vector loads and 6 broadcasts per 24 FMAs (the 8 × 32 tile: 2 and 8
// per 16), and the pv pair requests V's next line. A block of 64 keys or head-dim rows is 10
// tiles of 6 rows and one of 4 (in_tiles, with_rows: the ragged tile has its own instantiation),
// in one call of qk_pair / pv_pair per block, with Sᵀ's, Pᵀ's and Oᵀ's row stride a compile-time
// constant for the default tiles (kTileLd; kernels-lab fwd-24).
// Sapphire Rapids VM, lab 1 thread: the pair as 4 × 64 S2 +1.8 %, the V request S3 +3–5 %
// (kernels-lab fwd-13), 6 rows instead of 4 S2 +3 %, S3 +3–4 % (fwd-17); fewer memory ops per
// FMA, so no slower on Zen 4/5 in principle, where the 8 × 32 tile already runs at 94–97 % of
// the FMA loop.
#include <immintrin.h>

#include <type_traits>

#define ATTN_FLASH_NS flash_avx512_ns
#include "../simd/exp2_avx512.hpp"
#include "column_max_avx512.hpp"
#include "amx_dot.hpp"
#include "bf16_dot.hpp"
#include "flash_driver.hpp"
#include "tile_rows.hpp"
#include "../simd/half_avx512.hpp"

namespace attn::detail {
namespace flash_avx512_ns {
namespace {

// Accumulators are named variables, not arrays (GCC kept arrays of vectors on the stack in
// the AVX2 kernel: a store per FMA). Row r's accumulators are a<r>0 … a<r>3: its 16-query
// column groups, 2 for one panel, 4 for a pair of adjacent panels (P = 2).
#define ATTN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ATTN_DECL_ACC(r) __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0, a##r##3 = a##r##0;

// s[r][0..32P) = c2 · Σ_d k[r][d]·qt_p[d][0..32)   for r < R     k: (R, ldk), qt_p: (Dk, 32)
// P panels of queries per call: 1 (8 rows × 32 queries, 16 accumulators) or 2 (6 rows × 64, 24
// accumulators; the second panel's Qᵀ at qt + Dk·32, pack_qt's layout, its scores at s + 32); the
// pair loads 4 Qᵀ vectors and broadcasts 6 K scalars per 24 FMAs instead of 2 and 8 per 16
// (docs/kernels.md, "Where the FLOPs go, tile sizes"). Each score is the same FMA chain over d
// either way: the same bits.
// M (QkModifiers, flash_driver.hpp) applied in registers before the store: bit 0 the softcap
// c·tanh(s/c) (tanh_vec, the function tile_modifiers runs), bit 1 ALiBi s − slope·|rel − j|
// with j = j_first + r — no second pass over the tile.
// CM: also cmax[0..32P) = the column maxima of the R rows stored, max-ed into cmax's values
// unless first (the driver's kOpsColumnMax): the softmax's running max without its pass of
// loads over Sᵀ, (R − 1)·2P + 2P vmaxps on registers per call instead of R·2P on loads.
// EX (with CM, M = 0; the driver's speculative block, kOpsSpeculate): the softmax in the store
// against the running max the block starts from — each score x = c2·acc is stored as its weight
// 2^(x·log2 e − U) (U = ex[0..32P): m·log2 e as Ops::softmax rounds it), and the weights summed
// into ex + 64 (rows of even key index) and ex + 128 (odd), from 0 if first: Ops::softmax's
// exp_column in the same order, so the same bits where the block leaves the max where it was.
// LD: Sᵀ's row stride ldS fixed at compile time (Avx512Ops::kTileLd), or 0: the argument's.
template <int R, int P = 1, int M = 0, bool CM = false, bool EX = false, int LD = 0>
inline void qk_tile(const float* qt, const float* k, std::int64_t ldk, int Dk, float c2, float* s, int ldS,
                    const QkModifiers* mods = nullptr, float j_first = 0.0f, float* cmax = nullptr,
                    bool first = true, float* ex = nullptr) {
    static_assert((P == 1 && R <= 8) || (P == 2 && R <= 6), "16 (one panel) or 24 (pair) accumulators at most");
    if constexpr (LD != 0) ldS = LD;
    ATTN_ROWS(ATTN_DECL_ACC)
    const float* qt1 = qt + static_cast<std::int64_t>(Dk) * 32;  // the second panel (P = 2)
    for (int d = 0; d < Dk; ++d) {
        const __m512 q0 = _mm512_load_ps(qt + d * 32), q1 = _mm512_load_ps(qt + d * 32 + 16);
        [[maybe_unused]] __m512 q2 = q0, q3 = q1;
        if constexpr (P == 2) {
            q2 = _mm512_load_ps(qt1 + d * 32);
            q3 = _mm512_load_ps(qt1 + d * 32 + 16);
        }
        const float* kd = k + d;
#define STEP(r)                                               \
    if constexpr (R > r) {                                    \
        const __m512 kb = _mm512_set1_ps(kd[r * ldk]);        \
        a##r##0 = _mm512_fmadd_ps(kb, q0, a##r##0);           \
        a##r##1 = _mm512_fmadd_ps(kb, q1, a##r##1);           \
        if constexpr (P == 2) {                               \
            a##r##2 = _mm512_fmadd_ps(kb, q2, a##r##2);       \
            a##r##3 = _mm512_fmadd_ps(kb, q3, a##r##3);       \
        }                                                     \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
    const __m512 vc = _mm512_set1_ps(c2);
    // Zero where the modifier is off: finish() takes sl/re by value whether it reads them or not
    // (an indeterminate __m512 passed by value; clang warned at every STORE). Dead where unread:
    // GCC 12 then emits the same instructions but for register choices.
    [[maybe_unused]] __m512 cap, tk, sl0 = _mm512_setzero_ps(), sl1 = sl0, sl2 = sl0, sl3 = sl0, re0 = sl0, re1 = sl0,
                                     re2 = sl0, re3 = sl0;
    if constexpr ((M & 1) != 0) {
        // c·tanh(c2·acc/c) = (±c)·tanh(|c2|·acc/c) (tanh is odd; − when c2 < 0). tanh's argument
        // y = 2·log2 e·|c2|/c·|acc| takes one multiply (tanh_scaled512): |c2|, 1/c and 2·log2 e
        // folded into one factor tk, rounded once — unless tk is not a normal float32 (M bit 2,
        // see qk_modified: then y = |c2·acc|·(2·log2 e/c), one more multiply, as unfolded).
        cap = _mm512_set1_ps((M & 4) == 0 && c2 < 0.0f ? -mods->cap : mods->cap);
        const double kc = static_cast<double>(kTanhTwoLog2e) * mods->inv_cap;
        tk = _mm512_set1_ps(static_cast<float>((M & 4) != 0 ? kc : kc * (c2 < 0.0f ? -c2 : c2)));
    }
    if constexpr ((M & 2) != 0) {  // the call's columns: 32P of slope and rel
        sl0 = _mm512_loadu_ps(mods->slope);
        sl1 = _mm512_loadu_ps(mods->slope + 16);
        re0 = _mm512_loadu_ps(mods->rel);
        re1 = _mm512_loadu_ps(mods->rel + 16);
        if constexpr (P == 2) {
            sl2 = _mm512_loadu_ps(mods->slope + 32);
            sl3 = _mm512_loadu_ps(mods->slope + 48);
            re2 = _mm512_loadu_ps(mods->rel + 32);
            re3 = _mm512_loadu_ps(mods->rel + 48);
        }
    }
    // always_inline: out of line (as GCC left it), each call spilled the live accumulators.
    // acc → c2·acc, or with the softcap c·tanh(c2·acc/c).
    auto finish = [&](__m512 acc, int r, [[maybe_unused]] __m512 sl, [[maybe_unused]] __m512 re)
                      __attribute__((always_inline)) {
        __m512 x;
        if constexpr ((M & 5) == 1) x = _mm512_mul_ps(tanh_scaled512(acc, tk), cap);
        else if constexpr ((M & 5) == 5) x = _mm512_mul_ps(tanh_scaled512(_mm512_mul_ps(acc, vc), tk), cap);
        else x = _mm512_mul_ps(acc, vc);
        if constexpr ((M & 2) != 0) {
            const __m512 dist = _mm512_abs_ps(_mm512_sub_ps(re, _mm512_set1_ps(j_first + static_cast<float>(r))));
            x = _mm512_fnmadd_ps(sl, dist, x);
        }
        return x;
    };
    if constexpr (EX) {
        static_assert(CM && M == 0, "the speculative store takes the column maxima, no modifier");
        const __m512 l2e = _mm512_set1_ps(kLog2e);
        // Column group g: its rows' scores, maxima, weights and the two sums (group by group, so
        // that only one group's U, sums and max are live beside the accumulators).
        auto group = [&](int g, __m512 x0, __m512 x1, __m512 x2, __m512 x3, __m512 x4, __m512 x5, __m512 x6, __m512 x7)
                         __attribute__((always_inline)) {
            const __m512 u = _mm512_load_ps(ex + 16 * g);
            __m512 s0 = first ? _mm512_setzero_ps() : _mm512_load_ps(ex + 64 + 16 * g);
            __m512 s1 = first ? _mm512_setzero_ps() : _mm512_load_ps(ex + 128 + 16 * g);
            __m512 mx = _mm512_setzero_ps();
            const __m512 xs[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
            for (int r = 0; r < R; ++r) {
                const __m512 x = _mm512_mul_ps(xs[r], vc);
                mx = r == 0 ? x : _mm512_max_ps(mx, x);
                const __m512 e = exp2_ps512(_mm512_fmsub_ps(x, l2e, u));
                _mm512_store_ps(s + r * ldS + 16 * g, e);
                if (r % 2 == 0) s0 = _mm512_add_ps(s0, e);
                else s1 = _mm512_add_ps(s1, e);
            }
            _mm512_store_ps(ex + 64 + 16 * g, s0);
            _mm512_store_ps(ex + 128 + 16 * g, s1);
            _mm512_store_ps(cmax + 16 * g, first ? mx : _mm512_max_ps(mx, _mm512_load_ps(cmax + 16 * g)));
        };
        group(0, a00, a10, a20, a30, a40, a50, a60, a70);
        group(1, a01, a11, a21, a31, a41, a51, a61, a71);
        if constexpr (P == 2) {
            group(2, a02, a12, a22, a32, a42, a52, a62, a72);
            group(3, a03, a13, a23, a33, a43, a53, a63, a73);
        }
        return;
    }
    [[maybe_unused]] __m512 mx0, mx1, mx2, mx3;  // CM: the column maxima of the rows stored so far
    // Row r's column group g: finish, store, and (CM) into the group's maximum.
    auto put = [&](__m512 acc, int r, int g, __m512 sl, __m512 re, __m512& mx) __attribute__((always_inline)) {
        const __m512 x = finish(acc, r, sl, re);
        _mm512_store_ps(s + r * ldS + 16 * g, x);
        if constexpr (CM) mx = r == 0 ? x : _mm512_max_ps(mx, x);
    };
#define STORE(r)                                  \
    if constexpr (R > r) {                        \
        put(a##r##0, r, 0, sl0, re0, mx0);        \
        put(a##r##1, r, 1, sl1, re1, mx1);        \
        if constexpr (P == 2) {                   \
            put(a##r##2, r, 2, sl2, re2, mx2);    \
            put(a##r##3, r, 3, sl3, re3, mx3);    \
        }                                         \
    }
    ATTN_ROWS(STORE)
#undef STORE
    if constexpr (CM) {
        auto merge = [&](__m512 mx, int g) __attribute__((always_inline)) {
            _mm512_store_ps(cmax + 16 * g, first ? mx : _mm512_max_ps(mx, _mm512_load_ps(cmax + 16 * g)));
        };
        merge(mx0, 0);
        merge(mx1, 1);
        if constexpr (P == 2) {
            merge(mx2, 2);
            merge(mx3, 3);
        }
    }
}

// ot[r][0..32P) = alpha·ot[r] + Σ_j v[j][r]·p[j][0..32P)   for r < R   v: (nk, ldv), p: (nk, ldP)
// P as qk_tile: 1 panel (8 rows × 32 queries) or 2 adjacent panels (6 rows × 64: Pᵀ's and Oᵀ's
// columns of the two panels are contiguous); the same FMA chain over j per element either way.
// A (rescale): multiply the loaded Oᵀ by alpha; false where every α of the call is 1 (the
// caller passed alpha = nullptr), which gives the same bits without the multiply.
// LD: Pᵀ's and Oᵀ's row strides (ldP, ldO) fixed at compile time (Avx512Ops::kTileLd), or 0: the
// arguments'.
template <int R, int P = 1, bool A = true, int LD = 0>
inline void pv_tile(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, float* ot, int ldO,
                    const float* alpha, bool ask_next = true) {
    static_assert((P == 1 && R <= 8) || (P == 2 && R <= 6), "16 (one panel) or 24 (pair) accumulators at most");
    if constexpr (LD != 0) ldP = ldO = LD;
    [[maybe_unused]] __m512 al0 = _mm512_set1_ps(1.0f), al1 = al0, al2 = al0, al3 = al0;
    if constexpr (A) {
        al0 = _mm512_load_ps(alpha);
        al1 = _mm512_load_ps(alpha + 16);
        if constexpr (P == 2) {
            al2 = _mm512_load_ps(alpha + 32);
            al3 = _mm512_load_ps(alpha + 48);
        }
    }
    auto start = [&](const float* o, __m512 al) __attribute__((always_inline)) {
        if constexpr (A) return _mm512_mul_ps(_mm512_load_ps(o), al);
        else return _mm512_load_ps(o);
    };
    ATTN_ROWS(ATTN_DECL_ACC)
#define LOAD(r)                                                                   \
    if constexpr (R > r) {                                                        \
        a##r##0 = start(ot + r * ldO, al0);                                       \
        a##r##1 = start(ot + r * ldO + 16, al1);                                  \
        if constexpr (P == 2) {                                                   \
            a##r##2 = start(ot + r * ldO + 32, al2);                              \
            a##r##3 = start(ot + r * ldO + 48, al3);                              \
        }                                                                         \
    }
    ATTN_ROWS(LOAD)
#undef LOAD
    for (int j = 0; j < nk; ++j) {
        const __m512 p0 = _mm512_load_ps(p + j * ldP), p1 = _mm512_load_ps(p + j * ldP + 16);
        [[maybe_unused]] __m512 p2 = p0, p3 = p1;
        if constexpr (P == 2) {
            p2 = _mm512_load_ps(p + j * ldP + 32);
            p3 = _mm512_load_ps(p + j * ldP + 48);
        }
        const float* vj = v + j * ldv;
        // The pair's V reads: row j's next 16 floats (the calls for d + 16 … read them; past a
        // row's end, the next row's head or nothing: a prefetch never faults). The driver walks
        // d across all nk rows, whose lines lie ldv apart, and the hardware prefetchers did not
        // keep up there: +3-5 % on S3 (D = 128) on Sapphire Rapids, +0.5 % on S2 (kernels-lab
        // fwd-13). One load-port op per 16 FMAs: the pair with it still issues fewer memory ops
        // per FMA (9 / 16) than the one-panel tile (10 / 16). ask_next false: the previous tile asked
        // for the same line (pv_pair).
        if constexpr (P == 2)
            if (ask_next) _mm_prefetch(reinterpret_cast<const char*>(vj + 16), _MM_HINT_T0);
#define STEP(r)                                               \
    if constexpr (R > r) {                                    \
        const __m512 vb = _mm512_set1_ps(vj[r]);              \
        a##r##0 = _mm512_fmadd_ps(vb, p0, a##r##0);           \
        a##r##1 = _mm512_fmadd_ps(vb, p1, a##r##1);           \
        if constexpr (P == 2) {                               \
            a##r##2 = _mm512_fmadd_ps(vb, p2, a##r##2);       \
            a##r##3 = _mm512_fmadd_ps(vb, p3, a##r##3);       \
        }                                                     \
    }
        ATTN_ROWS(STEP)
#undef STEP
    }
#define STORE(r)                                              \
    if constexpr (R > r) {                                    \
        _mm512_store_ps(ot + r * ldO, a##r##0);               \
        _mm512_store_ps(ot + r * ldO + 16, a##r##1);          \
        if constexpr (P == 2) {                               \
            _mm512_store_ps(ot + r * ldO + 32, a##r##2);      \
            _mm512_store_ps(ot + r * ldO + 48, a##r##3);      \
        }                                                     \
    }
    ATTN_ROWS(STORE)
#undef STORE
}
#undef ATTN_DECL_ACC
#undef ATTN_ROWS

// f(integral_constant<int, R>, r) for r = 0, R, 2R, … < n, then f(integral_constant<int, n % R>, r)
// for the short tile at the end: n rows in R-row tiles, each a template instantiation.
template <int R, class F>
__attribute__((always_inline)) inline void in_tiles(int n, F&& f) {
    int r = 0;
    for (; r + R <= n; r += R) f(std::integral_constant<int, R>{}, r);
    if (r < n) with_rows<R>(n - r, [&](auto Rr) __attribute__((always_inline)) { f(Rr, r); });
}

struct Avx512Ops {
    static constexpr int kPanel = kFlashPanelAvx512;  // queries per panel: 2 zmm
    static constexpr int kRows = 8;      // keys (qk) / head-dim rows (pv) per call: the 8 × 32 tile
    static constexpr int kPairRows = 6;  // the same per tile of the pair, 6 × 64 (qk_pair, pv_pair tile a block with it)

    // P panels per call (qk_tile): qk one, qk_pair two adjacent ones (the driver's kOpsPanelPairs).
    // cmax: the column maxima too (qk_tile's CM; the driver's kOpsColumnMax), starting over if first.
    static constexpr bool kColumnMax = true;

    // The row stride of Sᵀ, Pᵀ and Oᵀ in the default tiles (Mb = 64, flash_default_tiles): qk and
    // pv run with it as a constant there (qk_tile's and pv_tile's LD), so each row of the call's
    // tile is the call's pointer plus an immediate. With ldO at run time GCC computed the 24 Oᵀ
    // row addresses of a pv call one by one and kept them on the stack and in xmm registers
    // (kernels-lab fwd-24). Other strides (the lab's and tests' tiles) take the same code with
    // the stride at run time: the same FMAs, the same bits.
    static constexpr int kTileLd = 64;
    // f(integral_constant<int, kTileLd>) where every stride given is kTileLd, else f(… 0).
    template <class F>
    __attribute__((always_inline)) static void with_ld(bool fixed, F&& f) {
        if (fixed) f(std::integral_constant<int, kTileLd>{});
        else f(std::integral_constant<int, 0>{});
    }

    template <int P>
    static void qk_p(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s, int ldS,
                     float* cmax = nullptr, bool first = true) {
        with_ld(ldS == kTileLd, [&](auto L) {
            constexpr int LD = decltype(L)::value;
            if (cmax != nullptr)
                with_rows<P == 1 ? kRows : kPairRows>(rows, [&](auto R) {
                    qk_tile<decltype(R)::value, P, 0, true, false, LD>(qt, k, ldk, Dk, c2, s, ldS, nullptr, 0.0f, cmax, first);
                });
            else
                with_rows<P == 1 ? kRows : kPairRows>(rows, [&](auto R) {
                    qk_tile<decltype(R)::value, P, 0, false, false, LD>(qt, k, ldk, Dk, c2, s, ldS);
                });
        });
    }
    static void qk(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s, int ldS,
                   float* cmax = nullptr, bool first = true) {
        qk_p<1>(qt, k, ldk, rows, Dk, c2, s, ldS, cmax, first);
    }
    // The pair tile over all nk key rows of a block in one call (the driver's kOpsPanelPairs):
    // 6-row tiles, then one short tile — one call per block and pair of panels, not one per tile
    // (kernels-lab fwd-24: S2 +0.7 %, S1 +1.6 % with pv_pair's alike). cmax: the column maxima too,
    // starting over at the block's first row (qk_tile's CM); ex: the softmax in the store as well
    // (qk_tile's EX; the driver's kOpsSpeculate, with cmax): ex holds U (64 floats) then the two
    // sums (64 each) of the pair's columns. ahead (or null): a few of the next key block's lines
    // requested before each tile (KvAhead, flash_operands.hpp; pv_pair's alike).
    static void qk_pair(const float* qt, const float* k, std::int64_t ldk, int nk, int Dk, float c2, float* s, int ldS,
                        float* cmax = nullptr, float* ex = nullptr, KvAhead* ahead = nullptr) {
        with_ld(ldS == kTileLd, [&](auto L) __attribute__((always_inline)) {
            constexpr int LD = decltype(L)::value;
            const int ld = LD != 0 ? LD : ldS;
            auto run = [&](auto CM, auto EX) __attribute__((always_inline)) {
                in_tiles<kPairRows>(nk, [&](auto R, int r) __attribute__((always_inline)) {
                    if (ahead != nullptr) ahead->request();
                    qk_tile<decltype(R)::value, 2, 0, decltype(CM)::value, decltype(EX)::value, LD>(
                        qt, k + r * ldk, ldk, Dk, c2, s + r * ld, ldS, nullptr, 0.0f, cmax, r == 0, ex);
                });
            };
            if (ex != nullptr) run(std::true_type{}, std::true_type{});
            else if (cmax != nullptr) run(std::true_type{}, std::false_type{});
            else run(std::false_type{}, std::false_type{});
        });
    }
    // Before a speculative block: U = m·log2 e into ex (ncols), as softmax rounds it; false unless
    // every column's m is finite with |m| below kFusedExponentBelow (softmax's fused form).
    static bool speculate_from(const float* m, float* ex, int ncols) {
        const __m512 l2e = _mm512_set1_ps(kLog2e), below = _mm512_set1_ps(kFusedExponentBelow);
        for (int c = 0; c < ncols; c += 16) {
            const __m512 mv = _mm512_load_ps(m + c);
            if (_mm512_cmp_ps_mask(_mm512_abs_ps(mv), below, _CMP_NLT_UQ) != 0) return false;  // NaN, ±inf too
            _mm512_store_ps(ex + c, _mm512_mul_ps(mv, l2e));
        }
        return true;
    }
    // After it: whether every column's max stayed (lazy_max would keep m); then l += the sums
    // (as softmax's l·α + sum with α = 1) and α = 1. Else nothing changes (the block runs again).
    static bool speculated(float* m, float* l, float* alpha, const float* cmax, const float* ex, int ncols) {
        const __m512 above = _mm512_set1_ps(kRescaleAbove);
        for (int c = 0; c < ncols; c += 16) {
            const __m512 mold = _mm512_load_ps(m + c), seen = _mm512_max_ps(mold, _mm512_load_ps(cmax + c));
            if (_mm512_cmp_ps_mask(_mm512_sub_ps(seen, mold), above, _CMP_GT_OQ) != 0) return false;
        }
        const __m512 one = _mm512_set1_ps(1.0f);
        for (int c = 0; c < ncols; c += 16) {
            const __m512 sum = _mm512_add_ps(_mm512_load_ps(ex + 64 + c), _mm512_load_ps(ex + 128 + c));
            _mm512_store_ps(l + c, _mm512_fmadd_ps(_mm512_load_ps(l + c), one, sum));
            _mm512_store_ps(alpha + c, one);
        }
        return true;
    }

    // qk with step 1 of the score rule in the store (flash_driver.hpp, QkModifiers).
    template <int M, int P>
    static void qk_mod(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s, int ldS,
                       const QkModifiers& m, float j_first) {
        with_rows<P == 1 ? kRows : kPairRows>(rows, [&](auto R) { qk_tile<decltype(R)::value, P, M>(qt, k, ldk, Dk, c2, s, ldS, &m, j_first); });
    }
    template <int P>
    static void qk_modified_p(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s,
                              int ldS, const QkModifiers& m, float j_first) {
        int mode = (m.cap > 0.0f ? 1 : 0) | (m.slope != nullptr ? 2 : 0);
        if (mode & 1) {  // bit 2: the folded tanh factor 2·log2 e·|c2|/c would overflow or underflow
            const double tk = static_cast<double>(kTanhTwoLog2e) * m.inv_cap * (c2 < 0.0f ? -c2 : c2);
            if (!(tk >= std::numeric_limits<float>::min() && tk <= std::numeric_limits<float>::max())) mode |= 4;
        }
        switch (mode) {
            case 1: qk_mod<1, P>(qt, k, ldk, rows, Dk, c2, s, ldS, m, j_first); break;
            case 2: qk_mod<2, P>(qt, k, ldk, rows, Dk, c2, s, ldS, m, j_first); break;
            case 3: qk_mod<3, P>(qt, k, ldk, rows, Dk, c2, s, ldS, m, j_first); break;
            case 5: qk_mod<5, P>(qt, k, ldk, rows, Dk, c2, s, ldS, m, j_first); break;
            case 7: qk_mod<7, P>(qt, k, ldk, rows, Dk, c2, s, ldS, m, j_first); break;
            default: qk_p<P>(qt, k, ldk, rows, Dk, c2, s, ldS); break;
        }
    }
    static void qk_modified(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s,
                            int ldS, const QkModifiers& m, float j_first) {
        qk_modified_p<1>(qt, k, ldk, rows, Dk, c2, s, ldS, m, j_first);
    }
    static void qk_modified_pair(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2,
                                 float* s, int ldS, const QkModifiers& m, float j_first) {
        qk_modified_p<2>(qt, k, ldk, rows, Dk, c2, s, ldS, m, j_first);
    }

    // alpha = nullptr: every α is 1 (the driver's pv_tile checked; no multiply). rows ≤ 8 (P = 1) or 6.
    template <int P>
    static void pv_p(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int rows, float* ot, int ldO,
                     const float* alpha) {
        with_ld(ldP == kTileLd && ldO == kTileLd, [&](auto L) {
            constexpr int LD = decltype(L)::value;
            if (alpha != nullptr)
                with_rows<P == 1 ? kRows : kPairRows>(rows, [&](auto R) {
                    pv_tile<decltype(R)::value, P, true, LD>(p, ldP, v, ldv, nk, ot, ldO, alpha);
                });
            else
                with_rows<P == 1 ? kRows : kPairRows>(rows, [&](auto R) {
                    pv_tile<decltype(R)::value, P, false, LD>(p, ldP, v, ldv, nk, ot, ldO, nullptr);
                });
        });
    }
    static void pv(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int rows, float* ot, int ldO,
                   const float* alpha) {
        pv_p<1>(p, ldP, v, ldv, nk, rows, ot, ldO, alpha);
    }
    // The pair tile over all Dv head-dim rows of Oᵀ in one call (as qk_pair over a block's keys).
    static void pv_pair(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int Dv, float* ot, int ldO,
                        const float* alpha, KvAhead* ahead = nullptr) {
        with_ld(ldP == kTileLd && ldO == kTileLd, [&](auto L) __attribute__((always_inline)) {
            constexpr int LD = decltype(L)::value;
            const int ld = LD != 0 ? LD : ldO;
            auto run = [&](auto A) __attribute__((always_inline)) {
                in_tiles<kPairRows>(Dv, [&](auto R, int d) __attribute__((always_inline)) {
                    if (ahead != nullptr) ahead->request();
                    // V's next lines: only a tile whose line d + 16 is not the previous tile's asks (at
                    // D = 64 four of the 11; the others asked again for lines in flight or in the L1:
                    // S1/S2/S3/S4 +0.7–1.5 %, kernels-lab fwd-30).
                    const bool fresh = d == 0 || (d + 16) / 16 != (d - kPairRows + 16) / 16;
                    pv_tile<decltype(R)::value, 2, decltype(A)::value, LD>(p, ldP, v + d, ldv, nk, ot + d * ld, ldO, alpha, fresh);
                });
            };
            if (alpha != nullptr) run(std::true_type{});
            else run(std::false_type{});
        });
    }

    // Online-softmax update, 16 query columns (one zmm) at a time, vertical over the nk keys.
    // Natural-unit scores, base-2 exponents (flash_driver.hpp says why). Each weight is
    // 2^(s·log2 e − U), the multiply and subtract as one FMA, with U = u·log2 e rounded once
    // (u: the max to subtract, 0 where it is −inf), and α = 2^(U_old − U), U_old = m_old·log2 e
    // rounded as the block before rounded it. So every weight carries the same factor 2^r,
    // r = u·log2 e − U, |r| ≤ half an ulp of u·log2 e: O = Oᵀ/l cancels it, lse = m + ln l is off
    // by r·ln 2 — the size of rounding u itself, as the scores are rounded (kernels-lab fwd-19
    // measures the errors); the max key's weight is 2^r, not 1 (l ≥ 1 − 2^-16, finite.hpp).
    // Only where every |u| of the 16 columns is below 2^8 (kFusedExponentBelow; the avx2 row's
    // softmax too), so |r| ≤ 2^-16: past that, r grows
    // with u (half an ulp of 1.4e9 is 64, and 2^64 weights overflow sums), so those columns
    // take 2^((s − u)·log2 e), the subtract first and exact near the max, as before.
    // The running max is lazy (lazy_max; not the avx2 row's): u moves only in a column whose block
    // raised its max by more than kRescaleAbove = 8·ln 2, else u and U stay and α = 2^0 = 1
    // exactly, so pv loads Oᵀ without its multiply (the driver's rescale_or_null) in most blocks
    // after a task's first. The same sums either way — every weight of a column and its l carry
    // the one factor e^(max − u) — so O = Oᵀ/l and lse = u + ln l are the same math; the weights
    // reach 2^8 instead of 1 (sums of Lk·2^8 weights: finite.hpp's bounds hold for Lk < 2^55),
    // and the key at the column's max still has a weight ≥ 2^r (l ≥ 1 − 2^-16).
    // Every exponent is ≤ 8 (+ 2^-16) or NaN but in a column holding a NaN score (vmaxps returns its
    // second operand on NaN, so the max may skip scores before it), whose sum, output and lse
    // are NaN already.
    // colmax: Sᵀ's column maxima as qk stored them (the driver's kOpsColumnMax; null where the
    // score rule changed Sᵀ after qk), else the pass over Sᵀ finds them.
    static void softmax(float* s, int ldS, int nk, int ncols, float* m, float* l, float* alpha,
                        const float* colmax = nullptr) {
        const __m512 l2e = _mm512_set1_ps(kLog2e), fused_below = _mm512_set1_ps(kFusedExponentBelow),
                     above = _mm512_set1_ps(kRescaleAbove);
        for (int c = 0; c < ncols; c += 16) {
            const __m512 mold = _mm512_load_ps(m + c);
            const __m512 seen = colmax != nullptr ? _mm512_max_ps(mold, _mm512_load_ps(colmax + c))
                                                  : block_max16(s, ldS, nk, c, mold);
            const ColumnMax cm = column_max_of(lazy_max(mold, seen, above));
            const bool fused = _mm512_cmp_ps_mask(_mm512_abs_ps(cm.use), fused_below, _CMP_NLT_UQ) == 0;
            const __m512 u = fused ? _mm512_mul_ps(cm.use, l2e) : cm.use;
            // U_old rounded by itself (mul_round: GCC contracts a plain multiply and subtract into
            // one FMA, which gave α = 2^(rounding error of U_old), not 1, where the max stayed).
            const __m512 al = exp2_ps512(fused ? _mm512_sub_ps(_mm512_mul_round_ps(mold, l2e, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), u)
                                               : _mm512_mul_ps(_mm512_sub_ps(mold, u), l2e));
            __m512 sum = _mm512_setzero_ps();
            if (fused) sum = exp_column(s + c, ldS, nk, [&](__m512 x) { return _mm512_fmsub_ps(x, l2e, u); });
            else sum = exp_column(s + c, ldS, nk, [&](__m512 x) { return _mm512_mul_ps(_mm512_sub_ps(x, u), l2e); });
            _mm512_store_ps(alpha + c, al);
            _mm512_store_ps(l + c, _mm512_fmadd_ps(_mm512_load_ps(l + c), al, sum));
            _mm512_store_ps(m + c, cm.max);
        }
    }
    // s[j][0..16) ← 2^exponent(s[j][0..16)) for j < nk; returns their column sums (two chains:
    // the add's latency).
    template <class Exponent>
    __attribute__((always_inline)) static __m512 exp_column(float* s, int ldS, int nk, Exponent exponent) {
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        int j = 0;
        for (; j + 2 <= nk; j += 2) {
            float* s0 = s + j * ldS;
            float* s1 = s0 + ldS;
            const __m512 e0 = exp2_ps512(exponent(_mm512_load_ps(s0)));
            const __m512 e1 = exp2_ps512(exponent(_mm512_load_ps(s1)));
            _mm512_store_ps(s0, e0);
            _mm512_store_ps(s1, e1);
            sum0 = _mm512_add_ps(sum0, e0);
            sum1 = _mm512_add_ps(sum1, e1);
        }
        if (j < nk) {
            float* sj = s + j * ldS;
            const __m512 e = exp2_ps512(exponent(_mm512_load_ps(sj)));
            _mm512_store_ps(sj, e);
            sum0 = _mm512_add_ps(sum0, e);
        }
        return _mm512_add_ps(sum0, sum1);
    }

    // 16 × 16 transpose (the driver's per-task Qᵀ pack and O store, flash_operands.hpp
    // "Per-task work"): out[r][c] = in[c][r] · scale[r] (scale null: a copy, bit for bit; with
    // scale, the same single multiply as store_row). Rows are 16 contiguous floats each.
    static void transpose16(const float* const* in, float* const* out, const float* scale) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in[i]);
        // 32-bit, then 64-bit interleaves inside 128-bit lanes, then 128-bit lane shuffles.
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) {
            r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
            r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
            r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
            r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        }
        // r[4q + k] holds element 4·(lane) + k of rows 4q..4q+3 per 128-bit lane; gather lanes.
        for (int k = 0; k < 4; ++k) {
            const __m512 a = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88), b = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
            const __m512 c = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88), d = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
            t[k] = _mm512_shuffle_f32x4(a, c, 0x88);       // lane 0 of each row group → column k
            t[8 + k] = _mm512_shuffle_f32x4(a, c, 0xdd);   // lane 2 → column 8 + k
            t[4 + k] = _mm512_shuffle_f32x4(b, d, 0x88);   // lane 1 → column 4 + k
            t[12 + k] = _mm512_shuffle_f32x4(b, d, 0xdd);  // lane 3 → column 12 + k
        }
        for (int i = 0; i < 16; ++i)
            _mm512_storeu_ps(out[i], scale ? _mm512_mul_ps(t[i], _mm512_set1_ps(scale[i])) : t[i]);
    }

    // n float16/bfloat16 values (element stride `stride`) → float32: simd/half_*.hpp, the
    // loaders the decode kernel of this ISA uses too.
    static void widen(const std::uint16_t* src, std::int64_t stride, std::int64_t n, bool is_f16, float* dst) {
        widen_row_avx512(src, stride, n, is_f16, dst);
    }

    // float32 → float16/bfloat16 by attn/half.hpp's rule (the O store of a 16-bit out).
    static void narrow16(const float* x, std::uint16_t* y, std::int64_t n, bool is_f16) {
        narrow_row_avx512(x, n, is_f16, y);
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

// bf16 compute for all-bfloat16 Q, K, V: the driver's operand hooks (flash_driver.hpp) with
// the bf16 pair micro-kernels of bf16_dot.hpp (flash_avx512_bf16.cpp, -mavx512bf16); the
// score rule, softmax, dropout and outputs are Avx512Ops' float32 code. What it adds to the
// error: Pᵀ is rounded to bf16 before P·V (relative 2^-8 per weight; docs/conventions.md,
// "bf16 compute"); Q·Kᵀ of bf16 inputs is exact products in float32 sums as before.
// This file has no bf16 instruction: packing bf16 pairs is integer moves.
struct Avx512Bf16Ops : Avx512Ops {
    using Pair = std::uint32_t;  // two bf16, the first in the low half
    // The driver's spread requests (kOpsOwnSpread): the next key block's K/V lines, O's rows and the
    // next task's Q rows, a few before each tile of qk_block and pv_block (w.kv_next).
    static constexpr bool kSpreadRequests = true;
    // A block of two panels (every full 64-query task) runs its products as 6-row × 64-query
    // tiles (qk_bf16_pair, pv_bf16_pair: 4 loads and 6 broadcasts per 24 vdpbf16ps, the 8 × 32
    // tile's 2 and 8 per 16 — the float32 row's pair tile); the same bits (kernels-lab fwd-46:
    // S2 +1-3 %, S3 level to +9 %, S4 +2 % per CPU-second on Zen 5). One panel keeps the 8 × 32 tiles.
    static constexpr int kPairRowsBf16 = 6;
    static bool pair_tiles(int panels) { return panels == 2; }
    static int request_tiles(int panels, std::int64_t nk, std::int64_t Dv) {
        if (pair_tiles(panels))
            return static_cast<int>((nk + kPairRowsBf16 - 1) / kPairRowsBf16 + (Dv + kPairRowsBf16 - 1) / kPairRowsBf16);
        return panels * static_cast<int>((nk + kRows - 1) / kRows + (Dv + kRows - 1) / kRows);
    }
    static std::int64_t half_up(std::int64_t n) { return (n + 1) / 2; }
    static std::size_t round64(std::int64_t bytes) { return static_cast<std::size_t>((bytes + 63) / 64 * 64); }
    // Scratch (Workspace::extra): Pᵀ pairs (⌈Nb/2⌉, Mb), V pairs (⌈Nb/2⌉, Dv), K rows padded
    // to an even length (Nb, 2⌈Dk/2⌉ bf16) — in that order, laid out from the workspace's tiles.
    static std::size_t p_bytes(std::int64_t Mb, std::int64_t Nb) { return round64(4 * half_up(Nb) * Mb); }
    static std::size_t v_bytes(const SdpaProblem& p, std::int64_t Nb) { return round64(4 * half_up(Nb) * p.Dv); }
    static std::size_t scratch_bytes(const SdpaProblem& p, const FlashTiles& t) {
        return p_bytes(t.Mb, t.Nb) + v_bytes(p, t.Nb) + round64(4 * t.Nb * half_up(p.Dk));
    }
    static Pair* p_pairs(const Workspace& w) { return static_cast<Pair*>(w.extra); }
    static Pair* v_pairs(const Workspace& w) {
        return reinterpret_cast<Pair*>(static_cast<char*>(w.extra) + p_bytes(w.tile_mb, w.tile_nb));
    }
    static std::uint16_t* k_rows(const SdpaProblem& p, const Workspace& w) {
        return reinterpret_cast<std::uint16_t*>(static_cast<char*>(w.extra) + p_bytes(w.tile_mb, w.tile_nb) + v_bytes(p, w.tile_nb));
    }

    // Every row of a 16-bit t starts on a 4-byte boundary (its pairs are aligned 32-bit words).
    static bool words_aligned(const TensorView& t) {
        return reinterpret_cast<std::uintptr_t>(t.data()) % 4 == 0 && t.stride(0) % 2 == 0 && t.stride(1) % 2 == 0 &&
               t.stride(2) % 2 == 0;
    }

    // Qᵀ as pair words: qt[panel][d/2][32], zero past Dk and past the last query (w.qt holds
    // Mb·Dk floats ≥ Mb·⌈Dk/2⌉ words).
    static void pack_q(const SdpaProblem& p, Workspace& w, std::int64_t b, int nq, int panels) {
        const std::uint16_t* q = p.q.data_as<const std::uint16_t>();
        const std::int64_t sd = p.q.stride(3), Dp = half_up(p.Dk);
        Pair* qt = reinterpret_cast<Pair*>(w.qt);
        if (sd == 1 && p.Dk % 32 == 0 && words_aligned(p.q)) {
            // A row's pairs are its 32-bit words: Qᵀ is the 16 × 16 transpose of words (a bit copy,
            // as the driver's float32 pack_qt_blocks), not one scattered word at a time.
            float* zeros = w.qrow;  // Dk ≥ Dp floats, a padding column's row
            for (std::int64_t d2 = 0; d2 < Dp; ++d2) zeros[d2] = 0.0f;
            const float* in[16];
            float* out[16];
            for (int c0 = 0; c0 < panels * kPanel; c0 += 16) {
                for (int c = 0; c < 16; ++c)
                    in[c] = c0 + c < nq ? reinterpret_cast<const float*>(q + p.q.offset(b, w.ch[c0 + c], w.ci[c0 + c], 0))
                                        : zeros;
                float* dst = reinterpret_cast<float*>(qt + (c0 / kPanel) * Dp * kPanel + c0 % kPanel);
                for (std::int64_t d0 = 0; d0 < Dp; d0 += 16) {
                    for (int r = 0; r < 16; ++r) out[r] = dst + (d0 + r) * kPanel;
                    transpose16(in, out, nullptr);
                    for (int c = 0; c < 16; ++c) in[c] += 16;
                }
            }
            return;
        }
        for (int c = 0; c < panels * kPanel; ++c) {
            Pair* dst = qt + (c / kPanel) * Dp * kPanel + c % kPanel;
            if (c >= nq) {
                for (std::int64_t d2 = 0; d2 < Dp; ++d2) dst[d2 * kPanel] = 0;
                continue;
            }
            const std::uint16_t* src = q + p.q.offset(b, w.ch[c], w.ci[c], 0);
            for (std::int64_t d2 = 0; d2 < Dp; ++d2) {
                const Pair hi = 2 * d2 + 1 < p.Dk ? src[(2 * d2 + 1) * sd] : 0;
                dst[d2 * kPanel] = src[2 * d2 * sd] | hi << 16;
            }
        }
    }

    static void qk_block(const SdpaProblem& p, Workspace& w, std::int64_t b, std::int64_t hk, int panels, std::int64_t j0,
                         std::int64_t nk, int ldS, float scale, bool as_stored) {
        const std::int64_t Dp = half_up(p.Dk);
        const std::uint16_t* k = p.k.data_as<const std::uint16_t>();
        const std::uint16_t* kp;
        std::int64_t ldk;
        const std::int64_t sd = p.k.stride(3);
        if (sd == 1 && p.Dk % 2 == 0 && one_run(p, j0, nk)) {  // the rows as they are: pairs are adjacent
            kp = k + kv_row_offset(p, false, b, hk, j0);
            ldk = p.k.stride(2);
        } else {  // strided head dim, odd Dk (the last pair needs a zero, not the next element), or pages
            std::uint16_t* buf = k_rows(p, w);
            ldk = 2 * Dp;
            for (std::int64_t j = 0; j < nk; ++j) {
                const std::uint16_t* row = k + kv_row_offset(p, false, b, hk, j0 + j);
                for (std::int64_t d = 0; d < p.Dk; ++d) buf[j * ldk + d] = row[d * sd];
                if (p.Dk % 2 != 0) buf[j * ldk + p.Dk] = 0;
            }
            kp = buf;
        }
        const Pair* qt = reinterpret_cast<const Pair*>(w.qt);
        KvAhead* ahead = w.kv_next;
        const bool raw = raw_scale(p, as_stored) > 0.0f;  // Sᵀ unscaled, its column maxima in w.colmax
        if (pair_tiles(panels)) {
            for (std::int64_t r = 0; r < nk; r += kPairRowsBf16) {
                if (ahead != nullptr) ahead->request();
                const int rows = static_cast<int>(imin(kPairRowsBf16, nk - r));
                flash_bf16_avx512_ns::qk_bf16_pair(qt, qt + Dp * kPanel, kp + r * ldk, ldk, rows, static_cast<int>(Dp),
                                                   scale, w.s + r * ldS, ldS, raw ? w.colmax : nullptr, r == 0);
            }
            return;
        }
        for (int pn = 0; pn < panels; ++pn)
            for (std::int64_t r = 0; r < nk; r += kRows) {
                if (ahead != nullptr) ahead->request();
                const int rows = static_cast<int>(imin(kRows, nk - r));
                if (raw)
                    flash_bf16_avx512_ns::qk_bf16_raw(qt + pn * Dp * kPanel, kp + r * ldk, ldk, rows, static_cast<int>(Dp),
                                                      w.s + r * ldS + pn * kPanel, ldS, w.colmax + pn * kPanel, r == 0);
                else
                    flash_bf16_avx512_ns::qk_bf16(qt + pn * Dp * kPanel, kp + r * ldk, ldk, rows, static_cast<int>(Dp),
                                                  scale, w.s + r * ldS + pn * kPanel, ldS);
            }
    }
    // Sᵀ unscaled where the softmax alone reads it (as_stored) and the scale is a plain positive
    // float (raw_scale): the product stores its sums as they are, with their column maxima
    // (qk_bf16_raw; qk_amx on the AMX row), and the softmax folds the scale into its exponent's
    // FMA and skips its pass over Sᵀ for the maxima — one multiply fewer per 16 scores in the
    // store, one subtract fewer and no pass of loads in the softmax (kernels-lab fwd-42: S2
    // +4-7 %, S3 +1-5 % per CPU-second on Zen 5); else Sᵀ holds the scores (the score rule
    // and the scores output read them).
    static float raw_scale(const SdpaProblem& p, bool as_stored) {
        const float c = static_cast<float>(p.scale);
        return as_stored && c >= 0x1p-60f && c <= 0x1p60f ? c : 0.0f;
    }

    // V rows of the key block as float32 (bf16 → f32 is exact: a shift), for the driver's
    // non-finite checks; pv_block packs them into pairs again.
    static const float* v_rows(const SdpaProblem& p, std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t nk,
                               float* vbuf, std::int64_t& ldv) {
        const std::uint16_t* v = p.v.data_as<const std::uint16_t>();
        const std::int64_t sd = p.v.stride(3);
        for (std::int64_t j = 0; j < nk; ++j) {
            const std::uint16_t* src = v + kv_row_offset(p, true, b, hk, j0 + j);
            float* dst = vbuf + j * p.Dv;
            std::int64_t d = 0;
            if (sd == 1)  // 16 at a time: zero-extend to 32 bits, shift into the high half
                for (; d + 16 <= p.Dv; d += 16) {
                    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + d));
                    _mm512_storeu_ps(dst + d, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
                }
            for (; d < p.Dv; ++d) {
                const std::uint32_t bits = static_cast<std::uint32_t>(src[d * sd]) << 16;
                std::memcpy(dst + d, &bits, sizeof bits);
            }
        }
        ldv = p.Dv;
        return vbuf;
    }

    // V pair words of keys [j0, j0+nk) straight from the bf16 tensor: word (key pair q, d) =
    // V[j0+2q][d] | V[j0+2q+1][d] << 16 (0 past the last key) — the bits pack_pairs_bf16 makes
    // from the widened rows (bf16 → f32 → bf16 is exact), without the float32 round trip. A
    // contiguous head dim interleaves 32 values of two rows with two vpermt2w. dst: rows of ld words.
    static void v_pairs_direct(const SdpaProblem& p, std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t nk,
                               Pair* dst, std::int64_t ld) {
        alignas(64) static constexpr short kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
        alignas(64) static constexpr short kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                      24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
        const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_load_si512(kHi);
        const std::uint16_t* v = p.v.data_as<const std::uint16_t>();
        const std::int64_t Dv = p.Dv, sd = p.v.stride(3);
        for (std::int64_t q = 0; q < half_up(nk); ++q) {
            const std::uint16_t* r0 = v + kv_row_offset(p, true, b, hk, j0 + 2 * q);
            const std::uint16_t* r1 = 2 * q + 1 < nk ? v + kv_row_offset(p, true, b, hk, j0 + 2 * q + 1) : nullptr;
            Pair* d = dst + q * ld;
            if (sd != 1) {
                for (std::int64_t e = 0; e < Dv; ++e)
                    d[e] = r0[e * sd] | (r1 ? static_cast<Pair>(r1[e * sd]) << 16 : 0u);
                continue;
            }
            for (std::int64_t e = 0; e < Dv; e += 32) {
                const std::int64_t n = imin(32, Dv - e);
                const __mmask32 m = n == 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
                const __m512i a = _mm512_maskz_loadu_epi16(m, r0 + e);
                const __m512i c = r1 ? _mm512_maskz_loadu_epi16(m, r1 + e) : _mm512_setzero_si512();
                const __mmask16 m0 = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
                const __mmask16 m1 = n >= 32 ? __mmask16(0xFFFF) : n > 16 ? __mmask16((1u << (n - 16)) - 1) : __mmask16(0);
                _mm512_mask_storeu_epi32(d + e, m0, _mm512_permutex2var_epi16(a, lo, c));
                _mm512_mask_storeu_epi32(d + e + 16, m1, _mm512_permutex2var_epi16(a, hi, c));
            }
        }
    }

    // A head's units of 32 keys (`words` Pair words each) kept in Workspace::thread_extra across a
    // thread's tasks, each made the first time a block of this thread needs it, so every later task
    // of the same (problem, b, KV head) on the thread — and its group's — reads them instead of
    // making them again: this row's V pairs (head_pairs), the AMX row's Vᵀ units (head_units). Kept
    // up to kKeptHeadBytes (Lk ≤ 8192 at Dv = 64, S2: 512 KiB; ≤ 4096 at Dv = 128, S3: 1 MiB): the
    // copy replaces V's rows in the L2, so a head's K and its copy need the L2 that K and V needed.
    // Layout: a header naming whose units they are (thread_extra starts zeroed each call, so a fresh
    // copy holds nobody's and never outlives the call whose V it was made from), a flag byte per
    // unit (made or not), then the units.
    static constexpr std::int64_t kKeptHeadBytes = std::int64_t{1} << 20;
    struct KeptHead {
        const SdpaProblem* p;
        std::int64_t b, hk;
    };
    static std::int64_t kept_units(const SdpaProblem& p, std::int64_t words) {  // 0: not kept
        const std::int64_t units = (p.Lk + 31) / 32;
        return 4 * units * words <= kKeptHeadBytes ? units : 0;
    }
    static std::size_t kept_head_bytes(const SdpaProblem& p, std::int64_t words) {
        const std::int64_t U = kept_units(p, words);
        return U > 0 ? round64(sizeof(KeptHead)) + round64(U) + round64(4 * U * words) : 0;
    }
    // The units of keys [j0, j0+nk) from the head's copy, make(j, unit) filling the unit of keys
    // j.. the first time; null where the copy is not kept or the block does not cover whole units
    // (j0 % 32 ≠ 0, or nk % 32 ≠ 0 short of Lk: a unit would hold keys past the block, which the
    // block's zero P rows would meet) — those blocks make their own. The same words either way (a
    // bit copy of V), so the same results.
    template <class Make>
    static const Pair* kept_head(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk,
                                 std::int64_t j0, std::int64_t nk, std::int64_t words, Make make) {
        const std::int64_t U = kept_units(p, words);
        if (U == 0 || j0 % 32 != 0 || (nk % 32 != 0 && j0 + nk != p.Lk)) return nullptr;
        char* r = static_cast<char*>(w.thread_extra);
        KeptHead* h = reinterpret_cast<KeptHead*>(r);
        unsigned char* made = reinterpret_cast<unsigned char*>(r + round64(sizeof(KeptHead)));
        Pair* units = reinterpret_cast<Pair*>(r + round64(sizeof(KeptHead)) + round64(U));
        if (h->p != &p || h->b != b || h->hk != hk) {  // another head's (or nobody's): start over
            *h = KeptHead{&p, b, hk};
            std::memset(made, 0, static_cast<std::size_t>(U));
        }
        const std::int64_t u0 = j0 / 32, u1 = (j0 + nk + 31) / 32;
        for (std::int64_t u = u0; u < u1; ++u)
            if (made[u] == 0) {
                make(32 * u, units + u * words);
                made[u] = 1;
            }
        return units + u0 * words;
    }
    // This row's kept copy: V's key pairs (16 pair rows of Dv words a unit), which v_pairs_direct
    // would otherwise make for every block of every task (≈ 8 % of S2's kernel samples; S2 +6 %,
    // S3 +3-5 %, S4 +5 % per CPU-second on the Zen 5 VM, kernels-lab fwd-37). The AMX row hides
    // these with its Vᵀ units.
    static std::size_t thread_scratch_bytes(const SdpaProblem& p, const FlashTiles& /*t*/) {
        return kept_head_bytes(p, 16 * p.Dv);
    }
    static const Pair* head_pairs(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk,
                                  std::int64_t j0, std::int64_t nk) {
        return kept_head(p, w, b, hk, j0, nk, 16 * p.Dv, [&](std::int64_t j, Pair* unit) {
            v_pairs_direct(p, b, hk, j, imin(32, p.Lk - j), unit, p.Dv);
        });
    }

    // The online softmax with the bf16 path's exp2, writing Pᵀ as bf16 key pairs
    // (flash_avx512_bf16.cpp, softmax_bf16: the rounding of Pᵀ, the one this path adds, at the
    // exp's store instead of a pass over Sᵀ in pv_block).
    // as_stored with raw_scale: Sᵀ unscaled and its column maxima in w.colmax (qk_block).
    static void softmax_block(const SdpaProblem& p, Workspace& w, int ldS, int nk, int ncols, bool pack, bool keep_f32,
                              bool as_stored) {
        const float rs = raw_scale(p, as_stored);
        flash_bf16_avx512_ns::softmax_bf16(w.s, ldS, nk, ncols, w.m, w.l, w.alpha, pack ? p_pairs(w) : nullptr,
                                           w.tile_mb, keep_f32, rs > 0.0f ? w.colmax : nullptr, rs);
    }

    // Pᵀ as key pairs (packed: by softmax_block; else rounded to bf16 here from Sᵀ, after dropout)
    // and V rows as key pairs (the head's kept copy where it holds the block: head_pairs), then
    // Oᵀ ← α·Oᵀ + V·Pᵀ on the pairs — without the α multiply for a panel whose running max did not
    // move (α = 1 in all its columns, the usual case once the row's large scores were seen).
    // vp = nullptr: V's pairs straight from the tensor.
    static void pv_block(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk, std::int64_t j0,
                         int panels, std::int64_t nk, int ldS, const float* vp, std::int64_t ldv, float* acc, int ldO,
                         bool packed) {
        Pair* pp = p_pairs(w);
        const Pair* vv = v_pairs(w);
        if (!packed) flash_bf16_avx512_ns::pack_pairs_bf16(w.s, ldS, nk, panels * kPanel, pp, w.tile_mb);
        if (vp != nullptr) flash_bf16_avx512_ns::pack_pairs_bf16(vp, ldv, nk, p.Dv, v_pairs(w), p.Dv);
        else if (const Pair* kept = head_pairs(p, w, b, hk, j0, nk)) vv = kept;
        else v_pairs_direct(p, b, hk, j0, nk, v_pairs(w), p.Dv);
        const int Jp = static_cast<int>(half_up(nk));
        const __m512 one = _mm512_set1_ps(1.0f);
        KvAhead* ahead = w.kv_next;
        if (pair_tiles(panels)) {
            // α over both panels where either's max moved: α = 1 multiplies exactly, the same bits.
            const float* al = w.alpha;
            bool moved = false;
            for (int c = 0; c < 2 * kPanel; c += 16) moved |= _mm512_cmp_ps_mask(_mm512_load_ps(al + c), one, _CMP_NEQ_UQ) != 0;
            for (std::int64_t d = 0; d < p.Dv; d += kPairRowsBf16) {
                if (ahead != nullptr) ahead->request();
                flash_bf16_avx512_ns::pv_bf16_pair(pp, w.tile_mb, vv + d, p.Dv, Jp, static_cast<int>(imin(kPairRowsBf16, p.Dv - d)),
                                                   acc + d * ldO, ldO, moved ? al : nullptr);
            }
            return;
        }
        for (int pn = 0; pn < panels; ++pn) {
            const float* al = w.alpha + pn * kPanel;
            const bool moved = _mm512_cmp_ps_mask(_mm512_load_ps(al), one, _CMP_NEQ_UQ) != 0 ||
                               _mm512_cmp_ps_mask(_mm512_load_ps(al + 16), one, _CMP_NEQ_UQ) != 0;
            for (std::int64_t d = 0; d < p.Dv; d += kRows) {
                if (ahead != nullptr) ahead->request();
                flash_bf16_avx512_ns::pv_bf16(pp + pn * kPanel, w.tile_mb, vv + d, p.Dv, Jp,
                                              static_cast<int>(imin(kRows, p.Dv - d)), acc + d * ldO + pn * kPanel, ldO,
                                              moved ? al : nullptr);
            }
        }
    }
};

// bf16 compute on AMX tiles (AMX-BF16, tdpbf16ps): Avx512Bf16Ops with the two products moved
// from vdpbf16ps to the tile micro-kernels of amx_dot.hpp (flash_amx_bf16.cpp). Everything
// else — the Qᵀ pair pack, the softmax and its bf16 rounding of Pᵀ, the score rule, dropout,
// the non-finite paths, the outputs — is the bf16 path's, so the results obey the same bound
// (docs/conventions.md, "bf16 compute"); only the float32 summation order differs. One
// shortcut, the same max: where the score rule left Sᵀ as qk_amx stored it (as_stored), the softmax
// takes each column's max from qk_amx, which found it on the staged tiles, instead of a pass over Sᵀ.
// What changes is the operands' layout: AMX reads 16-row tiles with a 32-element reduction
// step, so each operand is zero-padded in scratch to whole tiles (never read past a tensor):
//   Qᵀ pairs  (panels, Dq, 32)        Dq = ⌈Dk/32⌉·16 pair rows (w.qt itself when Dk % 32 == 0)
//   K rows    (⌈Nb/16⌉·16, 2·Dq) bf16  a copy only for a strided head dim, Dk % 32 != 0 or a
//                                      block across pages; else in place but for the last
//                                      nk % 16 rows (one zero-padded tile)
//   Pᵀ pairs  (Jq, Mb)                Jq = ⌈Nb/32⌉·16: the softmax's pairs, rows past the
//                                      block's keys zeroed per block
//   V pairs   (16, Dv16) → Vᵀ units (Jq/16, Dv16, 16)   Dv16 = ⌈Dv/16⌉·16: interleaved as the
//                                      bf16 path's, 16 pair rows (a 32-key unit) at a time, each
//                                      transposed as 16 × 16 words (transpose16) while in L1
//   staging   four 16 × 16 float32 C tiles (the scaled Sᵀ store; an Oᵀ tile past Dv)
//   col max   Mb floats: Sᵀ's column maxima, written by qk_amx
// and, shared by a thread's tasks (Workspace::thread_extra, thread_scratch_bytes):
//   head Vᵀ   (⌈Lk/32⌉, Dv16, 16) with a header and a flag per unit, when ≤ kKeptHeadBytes: the
//             Vᵀ units of one (problem, b, KV head), kept across the thread's tasks (head_units)
struct AmxBf16Ops : Avx512Bf16Ops {
    static constexpr bool kSpreadRequests = false;  // its tiles call no request(): all at once, as before
    static std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }
    static std::int64_t q_rows(const SdpaProblem& p) { return round_up(p.Dk, 32) / 2; }    // Dq
    static std::int64_t pair_rows(std::int64_t nk) { return round_up(half_up(nk), 16); }  // Jq
    static std::int64_t dv_rows(const SdpaProblem& p) { return round_up(p.Dv, 16); }      // Dv16
    static std::int64_t unit_words(const SdpaProblem& p) { return dv_rows(p) * 16; }      // one 32-key Vᵀ unit

    // A head's Vᵀ units, kept across a thread's tasks (head_units, the bf16 row's kept_head) up to
    // kKeptHeadBytes, one copy per thread: 2 MiB of L2 on Sapphire Rapids, the only CPUs with AMX,
    // holds a head's K and its copy.
    static std::size_t thread_scratch_bytes(const SdpaProblem& p, const FlashTiles& /*t*/) {
        return kept_head_bytes(p, unit_words(p));
    }

    // The scratch regions in order (bytes, each a multiple of 64).
    struct Layout {
        std::size_t p, vv, vt, k, q, stage, colmax;
    };
    static Layout layout(const SdpaProblem& p, std::int64_t Mb, std::int64_t Nb) {
        const std::int64_t J = pair_rows(Nb), D16 = dv_rows(p);
        return Layout{round64(4 * J * Mb),           round64(4 * 16 * D16), round64(4 * D16 * J),
                      round64(2 * round_up(Nb, 16) * 2 * q_rows(p)), round64(4 * Mb * q_rows(p)),
                      round64(4 * flash_amx_bf16_ns::kAmxStageFloats), round64(4 * Mb)};
    }
    static std::size_t scratch_bytes(const SdpaProblem& p, const FlashTiles& t) {
        const Layout l = layout(p, t.Mb, t.Nb);
        return l.p + l.vv + l.vt + l.k + l.q + l.stage + l.colmax;
    }
    // Region i of the layout (0: Pᵀ pairs, 1: V pairs, 2: Vᵀ units, 3: K rows, 4: Qᵀ pairs, 5: staging,
    // 6: Sᵀ's column maxima from qk_amx).
    static char* region(const SdpaProblem& p, const Workspace& w, int i) {
        const Layout l = layout(p, w.tile_mb, w.tile_nb);
        const std::size_t sizes[] = {l.p, l.vv, l.vt, l.k, l.q, l.stage};
        char* c = static_cast<char*>(w.extra);
        for (int r = 0; r < i; ++r) c += sizes[r];
        return c;
    }
    static Pair* amx_p(const Workspace& w) { return static_cast<Pair*>(w.extra); }  // region 0

    // Qᵀ pairs with Dq rows a panel: the bf16 path's pack (w.qt, ⌈Dk/2⌉ rows), copied into
    // zero-padded panels when ⌈Dk/2⌉ is not a multiple of 16.
    static const Pair* q_pairs(const SdpaProblem& p, const Workspace& w) {
        return half_up(p.Dk) == q_rows(p) ? reinterpret_cast<const Pair*>(w.qt) : reinterpret_cast<const Pair*>(region(p, w, 4));
    }
    static void pack_q(const SdpaProblem& p, Workspace& w, std::int64_t b, int nq, int panels) {
        Avx512Bf16Ops::pack_q(p, w, b, nq, panels);
        const std::int64_t Dp = half_up(p.Dk), Dq = q_rows(p);
        if (Dp == Dq) return;
        const Pair* src = reinterpret_cast<const Pair*>(w.qt);
        Pair* dst = reinterpret_cast<Pair*>(region(p, w, 4));
        for (int pn = 0; pn < panels; ++pn) {
            std::memcpy(dst + pn * Dq * kPanel, src + pn * Dp * kPanel, sizeof(Pair) * static_cast<std::size_t>(Dp * kPanel));
            std::memset(dst + (pn * Dq + Dp) * kPanel, 0, sizeof(Pair) * static_cast<std::size_t>((Dq - Dp) * kPanel));
        }
    }

    // Sᵀ unscaled where raw_scale (Avx512Bf16Ops) says: qk_amx stores whole tiles straight from the
    // tile registers.
    static void qk_block(const SdpaProblem& p, Workspace& w, std::int64_t b, std::int64_t hk, int panels, std::int64_t j0,
                         std::int64_t nk, int ldS, float scale, bool as_stored) {
        const std::int64_t Dq = q_rows(p), Dk32 = 2 * Dq, whole = nk / 16 * 16;
        const std::uint16_t* k = p.k.data_as<const std::uint16_t>();
        const std::int64_t sd = p.k.stride(3);
        std::uint16_t* buf = reinterpret_cast<std::uint16_t*>(region(p, w, 3));
        // Rows [r0, r1) of the block into buf (row stride Dk32), zero past Dk; rows up to the
        // next multiple of 16 zero.
        auto copy_rows = [&](std::int64_t r0, std::int64_t r1, std::uint16_t* dst) {
            for (std::int64_t j = r0; j < r1; ++j) {
                const std::uint16_t* row = k + kv_row_offset(p, false, b, hk, j0 + j);
                std::uint16_t* d = dst + (j - r0) * Dk32;
                if (sd == 1) std::memcpy(d, row, 2 * static_cast<std::size_t>(p.Dk));
                else
                    for (std::int64_t e = 0; e < p.Dk; ++e) d[e] = row[e * sd];
                std::memset(d + p.Dk, 0, 2 * static_cast<std::size_t>(Dk32 - p.Dk));
            }
            const std::int64_t end = r0 + round_up(r1 - r0, 16);
            std::memset(dst + (r1 - r0) * Dk32, 0, 2 * static_cast<std::size_t>((end - r1) * Dk32));
        };
        const std::uint16_t* kp;
        std::int64_t ldk;
        if (sd == 1 && p.Dk == Dk32 && one_run(p, j0, nk)) {  // whole tiles in place, the last rows copied
            kp = k + kv_row_offset(p, false, b, hk, j0);
            ldk = p.k.stride(2);
            if (whole < nk) copy_rows(whole, nk, buf);
        } else {
            copy_rows(0, nk, buf);
            kp = buf;
            ldk = Dk32;
            buf += whole * Dk32;
        }
        const float c2 = raw_scale(p, as_stored) > 0.0f ? 1.0f : scale;  // 1: Sᵀ unscaled
        flash_amx_bf16_ns::qk_amx(q_pairs(p, w), static_cast<int>(Dq), panels, kp, ldk, buf, static_cast<int>(nk), c2, w.s,
                                  ldS, reinterpret_cast<float*>(region(p, w, 5)), col_max(p, w));
    }
    static float* col_max(const SdpaProblem& p, const Workspace& w) { return reinterpret_cast<float*>(region(p, w, 6)); }

    // as_stored: Sᵀ is as qk_block left it, so the column maxima qk_amx found on the way hold and
    // the softmax skips its pass for them (and scales Sᵀ itself where qk_block left it unscaled);
    // else (a mask or modifier changed Sᵀ) it finds them itself.
    static void softmax_block(const SdpaProblem& p, Workspace& w, int ldS, int nk, int ncols, bool pack, bool keep_f32,
                              bool as_stored) {
        flash_bf16_avx512_ns::softmax_bf16(w.s, ldS, nk, ncols, w.m, w.l, w.alpha, pack ? amx_p(w) : nullptr, w.tile_mb,
                                           keep_f32, as_stored ? col_max(p, w) : nullptr, raw_scale(p, as_stored));
    }

    // Vᵀ units (amx_dot.hpp, pv_amx) of keys [j0, j0 + 32·units) into dst, zero past key jend
    // (the block's end, or Lk for the head's copy): V's pairs (from the float32 rows vp of keys
    // j0.. when given, else straight from the tensor) with zero words to Dv16, made one unit
    // (16 pair rows) at a time and transposed 16 × 16 words at a time while in L1 (a bit copy).
    static void v_units(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk, std::int64_t j0,
                        std::int64_t jend, std::int64_t units, const float* vp, std::int64_t ldv, Pair* dst) {
        const std::int64_t D16 = dv_rows(p);
        Pair* vv = reinterpret_cast<Pair*>(region(p, w, 1));
        const float* in[16];
        float* out[16];
        for (std::int64_t u = 0; u < units; ++u) {
            const std::int64_t k0 = j0 + 32 * u, keys = imin(32, imax(jend - k0, 0)), rows = half_up(keys);
            if (rows > 0 && vp != nullptr) flash_bf16_avx512_ns::pack_pairs_bf16(vp + (k0 - j0) * ldv, ldv, keys, p.Dv, vv, D16);
            else if (rows > 0) v_pairs_direct(p, b, hk, k0, keys, vv, D16);
            if (D16 > p.Dv)
                for (std::int64_t r = 0; r < rows; ++r) std::memset(vv + r * D16 + p.Dv, 0, sizeof(Pair) * static_cast<std::size_t>(D16 - p.Dv));
            std::memset(vv + rows * D16, 0, sizeof(Pair) * static_cast<std::size_t>((16 - rows) * D16));
            Pair* unit = dst + u * unit_words(p);
            for (std::int64_t d0 = 0; d0 < D16; d0 += 16) {
                for (int r = 0; r < 16; ++r) {
                    in[r] = reinterpret_cast<const float*>(vv + r * D16 + d0);
                    out[r] = reinterpret_cast<float*>(unit + (d0 + r) * 16);
                }
                transpose16(in, out, nullptr);
            }
        }
    }

    // The Vᵀ units of keys [j0, j0+nk) from the head's kept copy (kept_head): each pairing and
    // transposing of V made once per head and thread (S2: 32 query blocks a head, so 16 makes per
    // head and thread become one; kernels-lab.md fwd-16). kept_head's whole-unit rule matters here
    // too: the block's zero P rows would meet a unit's keys past the block (0·NaN is NaN, as
    // amx_dot.hpp assumes; tdpbf16ps on the Sapphire Rapids VM gave 0).
    static const Pair* head_units(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk,
                                  std::int64_t j0, std::int64_t nk) {
        return kept_head(p, w, b, hk, j0, nk, unit_words(p), [&](std::int64_t j, Pair* unit) {
            v_units(p, w, b, hk, j, p.Lk, 1, nullptr, 0, unit);
        });
    }

    // Oᵀ ← α·Oᵀ + Vᵀ·Pᵀ: α applied to a panel's accumulator rows first, only where its running
    // max moved (as the bf16 path); Pᵀ pairs past the block's keys zeroed; then the tiles.
    static void pv_block(const SdpaProblem& p, const Workspace& w, std::int64_t b, std::int64_t hk, std::int64_t j0,
                         int panels, std::int64_t nk, int ldS, const float* vp, std::int64_t ldv, float* acc, int ldO,
                         bool packed) {
        const int ncols = panels * kPanel;
        const std::int64_t Jp = half_up(nk), Jq = pair_rows(nk);
        Pair* pp = amx_p(w);
        if (!packed) flash_bf16_avx512_ns::pack_pairs_bf16(w.s, ldS, nk, ncols, pp, w.tile_mb);
        for (std::int64_t r = Jp; r < Jq; ++r) std::memset(pp + r * w.tile_mb, 0, sizeof(Pair) * static_cast<std::size_t>(ncols));
        // Vᵀ: the head's copy where it serves (V read from the tensor, whole units), else this block's.
        const Pair* vt = vp == nullptr ? head_units(p, w, b, hk, j0, nk) : nullptr;
        if (vt == nullptr) {
            Pair* own = reinterpret_cast<Pair*>(region(p, w, 2));
            v_units(p, w, b, hk, j0, j0 + nk, Jq / 16, vp, ldv, own);
            vt = own;
        }
        const __m512 one = _mm512_set1_ps(1.0f);
        for (int pn = 0; pn < panels; ++pn) {
            const float* al = w.alpha + pn * kPanel;
            const __m512 a0 = _mm512_load_ps(al), a1 = _mm512_load_ps(al + 16);
            if (_mm512_cmp_ps_mask(a0, one, _CMP_NEQ_UQ) == 0 && _mm512_cmp_ps_mask(a1, one, _CMP_NEQ_UQ) == 0) continue;
            for (std::int64_t d = 0; d < p.Dv; ++d) {
                float* o = acc + d * ldO + pn * kPanel;
                _mm512_store_ps(o, _mm512_mul_ps(_mm512_load_ps(o), a0));
                _mm512_store_ps(o + 16, _mm512_mul_ps(_mm512_load_ps(o + 16), a1));
            }
        }
        flash_amx_bf16_ns::pv_amx(pp, w.tile_mb, vt, static_cast<int>(Jq), static_cast<int>(p.Dv), panels, acc, ldO,
                                  reinterpret_cast<float*>(region(p, w, 5)));
    }
};

}  // namespace
}  // namespace flash_avx512_ns

void flash_forward_avx512(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) {
    flash_avx512_ns::run_flash<flash_avx512_ns::Avx512Ops>(jobs, n, tiles, threads);
}

// Q, K, V all bfloat16, on a CPU with AVX-512 BF16 (flash.cpp checks both).
void flash_forward_avx512_bf16(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) {
    flash_avx512_ns::run_flash<flash_avx512_ns::Avx512Bf16Ops>(jobs, n, tiles, threads);
}

// Q, K, V all bfloat16, on a CPU with AMX-BF16 (flash.cpp checks both).
void flash_forward_avx512_amx_bf16(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) {
    flash_avx512_ns::run_flash<flash_avx512_ns::AmxBf16Ops>(jobs, n, tiles, threads);
}

}  // namespace attn::detail
