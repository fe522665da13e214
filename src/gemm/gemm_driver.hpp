// The GEMM driver, templated on an ISA's micro-kernel U (included by gemm_portable.cpp,
// gemm_avx2.cpp, gemm_avx512.cpp inside their own namespace, so each is compiled with its
// ISA's flags and nothing is shared between them: instantiations on a type of an unnamed
// namespace have internal linkage).
//
// U provides:  kMR, kNR (the micro-tile), kKC, kMC, kNC (the cache blocks: KC the depth of a
// chunk, kMC the least rows of an A block — cache_blocks below fits MC and the B blocks to the
// L2 —, NC the most columns packed at once), and
//   tile(kc, a, b, c, ldc, beta, bias): c (kMR × kNR) = Σ_k a[k·MR + r] · b[k·NR + j]  +  beta · c,
//   one FMA chain per element in k order; beta = 0 does not read c, beta = 1 adds exactly;
//   a bias (kNR floats, only with beta = 0) is added to the chain's sum: c = sum + bias[j],
//   one rounding, the bits of beta = 1 on a C that held the bias.
// A U with `kPairs = true` (the bf16 pair micro-kernel, gemm_avx512_bf16.cpp) reads its panels as
// bf16 pair words instead of floats: ⌈kc/2⌉ rows of pairs (op[k], op[k+1]) along k, a zero half
// past kc — half the rows in the same buffers (depth<U> below). Its operands are both bfloat16.
// A U with `kAmxPanels = true` too (the AMX micro-kernel, gemm_amx_bf16.cpp) reads op(B) the same
// way but op(A) as tile rows (pack_a_rows below: 16-row tiles of 32 bf16 along k per step), and
// gives a `ThreadScope` type that each thread of a call holds while it runs tiles (the tile
// configuration: every OpenMP thread loads its own).
//
// Loops (BLIS order, with B blocks): jc (NC columns) → pc (KC depth, in order) → [all threads
// pack B] → each thread: ic (MC rows of its share) → pack A → B blocks of its slivers → ir (MR)
// → jr (NR slivers of the block). MC and the B block follow the L2 size (cache_blocks).
// Determinism: an element's K loop is the pc chunks in order, each one FMA chain in the
// micro-kernel, added to C (beta = 1 after the first chunk); the chunk bounds depend on K
// alone. Threads split rows (or, when there are few rows, columns) — which thread computes
// an element never changes its arithmetic, and a partial edge tile goes through a scratch
// tile with the same micro-kernel.
#pragma once

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../core/cpu_features.hpp"
#include "../core/float_env.hpp"
#include "attn/half.hpp"
#include "gemm.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace attn::detail {
namespace ATTN_GEMM_NS {
namespace {

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// An operand's element at `index` (float32 or 16-bit, widened exactly): the packing
// routines below are templated on it, so the float32 GEMM's loops are unchanged.
struct F32Src {
    const float* p;
    float operator[](std::int64_t i) const { return p[i]; }
};
struct F16Src {
    const std::uint16_t* p;
    float operator[](std::int64_t i) const {
#if defined(__F16C__)
        return _cvtsh_ss(p[i]);
#else
        return f16_to_float(p[i]);
#endif
    }
};
struct Bf16Src {
    const std::uint16_t* p;
    std::uint32_t raw(std::int64_t i) const { return p[i]; }  // the bits, for pair words
    // Elements i and i + 1 as one pair word (i in the low half): one 32-bit load on this
    // little-endian target, where two 16-bit loads, a shift and an or cost the pair packing
    // ~10 % of the bf16 GEMM's time.
    std::uint32_t word(std::int64_t i) const {
        static_assert(std::endian::native == std::endian::little, "pair words are built by a 32-bit load");
        std::uint32_t w;
        std::memcpy(&w, p + i, sizeof w);
        return w;
    }
    float operator[](std::int64_t i) const {
        const std::uint32_t bits = static_cast<std::uint32_t>(p[i]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return f;
    }
};

// Calls f(src) with the operand's element reader.
template <class F>
void with_src(GemmHalf t, const float* p, const std::uint16_t* p16, F&& f) {
    switch (t) {
        case GemmHalf::none: f(F32Src{p}); break;
        case GemmHalf::f16: f(F16Src{p16}); break;
        case GemmHalf::bf16: f(Bf16Src{p16}); break;
    }
}

// The transposing copies (op(B) = Bᵀ, the projections' weights; op(A) = A, their inputs) write
// with a stride of NR (MR) floats. Column by column over a whole kc, every store of a column
// lands on another cache line of a kc × NR block larger than L1 (96 KiB at kc = 768, NR = 32),
// evicted again before the next column comes back to it: each store was an L1 miss (perf: the
// packing's stores were its hottest instructions, ~10 % of the AVX-512 GEMM). In kKB-deep
// pieces the destination piece (8 KiB at NR = 32, 16 KiB at 64) stays in L1 while all its
// columns fill it.
constexpr std::int64_t kKB = 64;

// Rows of a packed panel for kc steps of k: kc floats, or ⌈kc/2⌉ pair words (kPairs).
template <class U>
constexpr bool kPairsOf = requires { U::kPairs; };
template <class U>
constexpr std::int64_t depth(std::int64_t kc) {
    if constexpr (kPairsOf<U>) return (kc + 1) / 2;
    else return kc;
}

// AMX tile rows for op(A) (pack_a_rows): a panel is ⌈MR/16⌉ tiles of 16 rows (rows past MR
// zero) by ⌈kc/32⌉ steps of 32 bf16 (zero past kc), so a tile load never reads past the panel
// and a padded row or k adds exactly 0 (amx_tiles.hpp: one tile shape, edges zero-padded).
template <class U>
constexpr bool kAmxPanelsOf = requires { U::kAmxPanels; };
constexpr std::int64_t kAmxTileRows = 16, kAmxStepK = 32;  // a tile: 16 rows × 32 bf16 (64 bytes)

// The floats of one packed op(A) panel of U for kc steps of k: MR rows of depth<U>(kc) words,
// or (AMX) its tiles by steps of kAmxStepK bf16 (half as many words).
template <class U>
constexpr std::int64_t a_panel_floats(std::int64_t kc) {
    if constexpr (kAmxPanelsOf<U>)
        return ceil_div(U::kMR, kAmxTileRows) * kAmxTileRows * ceil_div(kc, kAmxStepK) * (kAmxStepK / 2);
    else return U::kMR * depth<U>(kc);
}

// The blocks above KC, sized to this CPU's L2 (CpuFeatures::l2_bytes; GemmArgs::l2_bytes for a test
// running another CPU's blocks): MC rows of packed A
// per A block, and B blocks of `slivers` NR slivers — every panel of an A block meets every
// sliver of a B block before the next B block, so both stay in L2 (the A block and one B block
// fill at most 4/5 of it: half for A at most) and C is written in runs of slivers·NR columns
// rather than column by column 9 KiB apart. U::kMC is the least MC (the block measured on a
// 1 MiB L2), 4·kMC the most. On Sapphire Rapids (2 MiB): S6's QKV GEMM (kc = 768) took 264
// rows and 8 slivers of 32 with the 12 × 32 tile — 1-thread rate 62–64 → 66–69 % of the AVX-512
// peak, the avx2 row +10–13 % (docs/kernels-lab.md, gemm-8) — and takes 270 rows and 4 slivers
// of 64 with the 6 × 64 one (576-row A blocks: QKV GEMM +1–4 %, out GEMM −3 … −8 %: gemm-9).
// Neither size touches an element's arithmetic (KC's, a function of K alone, does): only the
// order in which tiles are computed.
struct CacheBlocks {
    std::int64_t mc, slivers;
};
// Long A blocks (a U with kLongABlocksBelowL2 = bytes: the avx512 row's float32 kernel): on an L2
// smaller than that, B blocks of one sliver, each kept in the L2 while up to kLongARows rows of A
// panels stream past it from the L3 (86–114 panels a visit in S6's QKV GEMM, where the fitted
// blocks give 22–23), instead of both blocks fitted into the L2. Zen 5 (1 MiB), per CPU-second,
// medians of 9 paired runs: S6's QKV GEMM +3.5 % (1 thread) / +4.8 % (2 threads), the out GEMM
// −0.6 % / +0.2 % (docs/kernels-lab.md, gemm-11). Sapphire Rapids (2 MiB) keeps the fitted blocks:
// long A blocks cost its out GEMM 3–8 % (gemm-9). Only the order of the tiles changes.
constexpr std::int64_t kLongARows = 1024;
template <class U>
constexpr std::int64_t kLongABlocksBelowL2Of = 0;
template <class U>
    requires requires { U::kLongABlocksBelowL2; }
constexpr std::int64_t kLongABlocksBelowL2Of<U> = U::kLongABlocksBelowL2;

template <class U>
CacheBlocks cache_blocks(std::int64_t kc, std::int64_t m, std::int64_t l2_bytes) {
    const std::int64_t l2 = l2_bytes > 0 ? l2_bytes : cpu_features().l2_bytes;
    if (l2 < kLongABlocksBelowL2Of<U>) return {std::min(kLongARows / U::kMR * U::kMR, ceil_div(m, U::kMR) * U::kMR), 1};
    const std::int64_t budget = l2 / 5 * 4;
    const std::int64_t panel_bytes = a_panel_floats<U>(kc) * 4, sliver_bytes = U::kNR * depth<U>(kc) * 4;
    std::int64_t mc = std::max<std::int64_t>(U::kMC, budget / 2 / panel_bytes * U::kMR);
    mc = std::min({mc, 4 * U::kMC, ceil_div(m, U::kMR) * U::kMR});
    const std::int64_t slivers = std::max<std::int64_t>(1, (budget - mc / U::kMR * panel_bytes) / sliver_bytes);
    return {mc, slivers};
}

// What each thread of a call holds while it runs U's tiles: U::ThreadScope (AMX: the tile
// configuration), or nothing.
struct NoThreadScope {};
template <class U>
struct ThreadScopeOfT {
    using type = NoThreadScope;
};
template <class U>
    requires requires { typename U::ThreadScope; }
struct ThreadScopeOfT<U> {
    using type = typename U::ThreadScope;
};
template <class U>
using ThreadScopeOf = typename ThreadScopeOfT<U>::type;

// A pair word: the bf16 at k in the low half, the one at k + 1 in the high half (0 past kc).
inline std::uint32_t pair_word(std::uint32_t lo, std::uint32_t hi) { return lo | (hi << 16); }

// pack_b_from's layout in pair words: dst ⌈kc/2⌉ × NR, word [p][c] = (op(B)[k0+2p][j+c],
// op(B)[k0+2p+1][j+c]), columns n..NR zero. With tb the two halves are adjacent in B's row.
template <class U>
void pack_b_pairs(const GemmArgs& g, Bf16Src B, std::int64_t k0, std::int64_t kc, std::int64_t j, std::int64_t n,
                  std::uint32_t* dst) {
    constexpr std::int64_t NR = U::kNR;
    const std::int64_t np = (kc + 1) / 2;
    if (!g.tb) {
        for (std::int64_t p = 0; p < np; ++p) {
            const std::int64_t r0 = (k0 + 2 * p) * g.ldb + j, r1 = r0 + g.ldb;
            const bool second = 2 * p + 1 < kc;
            std::uint32_t* d = dst + p * NR;
            for (std::int64_t c = 0; c < n; ++c) d[c] = pair_word(B.raw(r0 + c), second ? B.raw(r1 + c) : 0);
            for (std::int64_t c = n; c < NR; ++c) d[c] = 0;
        }
    } else {  // op(B)[k][j] = B[j·ldb + k]: each column's pairs are adjacent in B's row; kKB pairs at a time
        for (std::int64_t pb = 0; pb < np; pb += kKB) {
            const std::int64_t pn = std::min(kKB, np - pb);
            std::uint32_t* d = dst + pb * NR;
            const std::int64_t whole = std::min(pn, kc / 2 - pb);  // pairs with both halves inside kc
            for (std::int64_t c = 0; c < n; ++c) {
                const std::int64_t src = (j + c) * g.ldb + k0 + 2 * pb;
                for (std::int64_t p = 0; p < whole; ++p) d[p * NR + c] = B.word(src + 2 * p);
                if (whole < pn) d[whole * NR + c] = pair_word(B.raw(src + 2 * whole), 0);
            }
            for (std::int64_t c = n; c < NR; ++c)
                for (std::int64_t p = 0; p < pn; ++p) d[p * NR + c] = 0;
        }
    }
}

// dst: kc × NR (k-major) = op(B)[k0.., j..j+n), columns n..NR zero.
template <class U, class S>
void pack_b_from(const GemmArgs& g, S B, std::int64_t k0, std::int64_t kc, std::int64_t j, std::int64_t n, float* dst) {
    constexpr std::int64_t NR = U::kNR;
    if (!g.tb) {
        for (std::int64_t k = 0; k < kc; ++k) {
            const std::int64_t src = (k0 + k) * g.ldb + j;
            float* d = dst + k * NR;
            if (n == NR) {
                for (std::int64_t c = 0; c < NR; ++c) d[c] = B[src + c];
            } else {
                for (std::int64_t c = 0; c < n; ++c) d[c] = B[src + c];
                for (std::int64_t c = n; c < NR; ++c) d[c] = 0.0f;
            }
        }
    } else {  // op(B)[k][j] = B[j·ldb + k]: read the n rows of B contiguously, kKB at a time
        std::int64_t k_done = 0;
        if constexpr (requires { U::kTransposeBlock; } && std::is_same_v<S, F32Src>) {
            // The ISA's register transpose of T × T float32 blocks (a full sliver; the rest,
            // and 16-bit operands, below).
            constexpr std::int64_t T = U::kTransposeBlock;
            static_assert(NR % T == 0, "whole transpose blocks per sliver");
            if (n == NR) {
                for (; k_done + T <= kc; k_done += T)
                    for (std::int64_t c = 0; c < NR; c += T)
                        U::transpose_block(B.p + (j + c) * g.ldb + k0 + k_done, g.ldb, dst + k_done * NR + c, NR);
            }
        }
        for (std::int64_t kb = k_done; kb < kc; kb += kKB) {
            const std::int64_t kn = std::min(kKB, kc - kb);
            float* d = dst + kb * NR;
            for (std::int64_t c = 0; c < n; ++c) {
                const std::int64_t src = (j + c) * g.ldb + k0 + kb;
                for (std::int64_t k = 0; k < kn; ++k) d[k * NR + c] = B[src + k];
            }
            for (std::int64_t c = n; c < NR; ++c)
                for (std::int64_t k = 0; k < kn; ++k) d[k * NR + c] = 0.0f;
        }
    }
}

template <class U>
void pack_b(const GemmArgs& g, std::int64_t k0, std::int64_t kc, std::int64_t j, std::int64_t n, float* dst) {
    if constexpr (kPairsOf<U>) pack_b_pairs<U>(g, Bf16Src{g.B16}, k0, kc, j, n, reinterpret_cast<std::uint32_t*>(dst));
    else with_src(g.b16, g.B, g.B16, [&](auto B) { pack_b_from<U>(g, B, k0, kc, j, n, dst); });
}

// dst: panels of MR rows, each kc × MR (k-major) = op(A)[i.., k0..], rows past m zero.
template <std::int64_t MR, class S>
void pack_a_from(const GemmArgs& g, S A, std::int64_t i, std::int64_t m, std::int64_t k0, std::int64_t kc, float* dst) {
    for (std::int64_t p = 0; p < m; p += MR, dst += MR * kc) {
        const std::int64_t rows = std::min(MR, m - p);
        if (!g.ta) {  // op(A)[r][k] = A[a_row(r) + k]: read each row contiguously, kKB at a time
            for (std::int64_t kb = 0; kb < kc; kb += kKB) {
                const std::int64_t kn = std::min(kKB, kc - kb);
                float* d = dst + kb * MR;
                for (std::int64_t r = 0; r < rows; ++r) {
                    const std::int64_t src = a_row(g, i + p + r) + k0 + kb;
                    for (std::int64_t k = 0; k < kn; ++k) d[k * MR + r] = A[src + k];
                }
                for (std::int64_t r = rows; r < MR; ++r)
                    for (std::int64_t k = 0; k < kn; ++k) d[k * MR + r] = 0.0f;
            }
        } else {  // op(A)[r][k] = A[k·lda + r]
            for (std::int64_t k = 0; k < kc; ++k) {
                const std::int64_t src = (k0 + k) * g.lda + i + p;
                float* d = dst + k * MR;
                for (std::int64_t r = 0; r < rows; ++r) d[r] = A[src + r];
                for (std::int64_t r = rows; r < MR; ++r) d[r] = 0.0f;
            }
        }
    }
}

// pack_a_from's layout in pair words: panels of MR rows, each ⌈kc/2⌉ × MR, word [p][r] =
// (op(A)[i+r][k0+2p], op(A)[i+r][k0+2p+1]), rows past m zero. Without ta the halves are adjacent.
template <std::int64_t MR>
void pack_a_pairs(const GemmArgs& g, Bf16Src A, std::int64_t i, std::int64_t m, std::int64_t k0, std::int64_t kc,
                  std::uint32_t* dst) {
    const std::int64_t np = (kc + 1) / 2;
    for (std::int64_t q = 0; q < m; q += MR, dst += MR * np) {
        const std::int64_t rows = std::min(MR, m - q);
        if (!g.ta) {  // op(A)[r][k] = A[a_row(r) + k]: read each row contiguously, kKB pairs at a time
            for (std::int64_t pb = 0; pb < np; pb += kKB) {
                const std::int64_t pn = std::min(kKB, np - pb);
                std::uint32_t* d = dst + pb * MR;
                const std::int64_t whole = std::min(pn, kc / 2 - pb);  // pairs with both halves inside kc
                for (std::int64_t r = 0; r < rows; ++r) {
                    const std::int64_t src = a_row(g, i + q + r) + k0 + 2 * pb;
                    for (std::int64_t p = 0; p < whole; ++p) d[p * MR + r] = A.word(src + 2 * p);
                    if (whole < pn) d[whole * MR + r] = pair_word(A.raw(src + 2 * whole), 0);
                }
                for (std::int64_t r = rows; r < MR; ++r)
                    for (std::int64_t p = 0; p < pn; ++p) d[p * MR + r] = 0;
            }
        } else {  // op(A)[r][k] = A[k·lda + r]
            for (std::int64_t p = 0; p < np; ++p) {
                const std::int64_t r0 = (k0 + 2 * p) * g.lda + i + q, r1 = r0 + g.lda;
                const bool second = 2 * p + 1 < kc;
                std::uint32_t* d = dst + p * MR;
                for (std::int64_t r = 0; r < rows; ++r) d[r] = pair_word(A.raw(r0 + r), second ? A.raw(r1 + r) : 0);
                for (std::int64_t r = rows; r < MR; ++r) d[r] = 0;
            }
        }
    }
}

// AMX tile rows (a_panel_floats above): panels of MR rows in tiles of 16, per step s of 32 k
// the tiles' rows of 32 bf16 each (64 bytes, the tile row stride): bf16 [s][r][x] =
// op(A)[i+r][k0+32s+x], zero past m (to the tile) and past kc (to the step).
template <std::int64_t MR>
void pack_a_rows(const GemmArgs& g, Bf16Src A, std::int64_t i, std::int64_t m, std::int64_t k0, std::int64_t kc,
                 std::uint16_t* dst) {
    constexpr std::int64_t RT = ceil_div(MR, kAmxTileRows) * kAmxTileRows, S = kAmxStepK;
    const std::int64_t ns = ceil_div(kc, S);
    for (std::int64_t q = 0; q < m; q += MR, dst += RT * ns * S) {
        const std::int64_t rows = std::min(MR, m - q);
        if (!g.ta) {  // each row's k are contiguous in A: one copy of up to 64 bytes per (row, step)
            for (std::int64_t s = 0; s < ns; ++s) {
                const std::int64_t n = std::min(S, kc - s * S);
                std::uint16_t* d = dst + s * RT * S;
                for (std::int64_t r = 0; r < rows; ++r) {
                    std::memcpy(d + r * S, A.p + a_row(g, i + q + r) + k0 + s * S, static_cast<std::size_t>(n) * 2);
                    if (n < S) std::memset(d + r * S + n, 0, static_cast<std::size_t>(S - n) * 2);
                }
                std::memset(d + rows * S, 0, static_cast<std::size_t>((RT - rows) * S) * 2);
            }
        } else {  // op(A)[r][k] = A[k·lda + r]: each k's rows are contiguous in A
            std::memset(dst, 0, static_cast<std::size_t>(RT * ns * S) * 2);
            for (std::int64_t k = 0; k < kc; ++k) {
                const std::uint16_t* src = A.p + (k0 + k) * g.lda + i + q;
                std::uint16_t* d = dst + (k / S) * RT * S + k % S;
                for (std::int64_t r = 0; r < rows; ++r) d[r * S] = src[r];
            }
        }
    }
}

// The thread grid tm × tn (tm·tn = nt): tm groups of rows (MR panels) times tn groups of NR
// slivers; returns tm. Rows alone while every thread gets at least 4 panels (the B block then
// streams once per thread); else the most row groups (a divisor of nt) that still give each 4
// panels, and the remaining factor of the threads over the slivers. A projection of a few
// hundred rows on many threads thus keeps them busy (S6's 171 panels of 12 rows on 64 threads:
// 32 × 2, E = 0.89, where columns alone gave its out GEMM's 24 slivers E = 0.38; its 342 panels
// of 6 rows: 64 × 1, E = 0.89), and few rows (a decode
// step's) split the columns. Which thread computes an element never changes its arithmetic.
inline std::int64_t row_groups(std::int64_t m_panels, int nt) {
    for (std::int64_t d = nt; d > 1; --d)
        if (nt % d == 0 && m_panels >= 4 * d) return d;
    return 1;
}

// op(A)'s MR-row panels for micro-kernel U (U::kMR, or a few-row variant's R).
template <class U>
void pack_a(const GemmArgs& g, std::int64_t i, std::int64_t m, std::int64_t k0, std::int64_t kc, float* dst) {
    if constexpr (kAmxPanelsOf<U>) pack_a_rows<U::kMR>(g, Bf16Src{g.A16}, i, m, k0, kc, reinterpret_cast<std::uint16_t*>(dst));
    else if constexpr (kPairsOf<U>) pack_a_pairs<U::kMR>(g, Bf16Src{g.A16}, i, m, k0, kc, reinterpret_cast<std::uint32_t*>(dst));
    else with_src(g.a16, g.A, g.A16, [&](auto A) { pack_a_from<U::kMR>(g, A, i, m, k0, kc, dst); });
}

// One micro-tile at C row i, column j; m × n of it inside C. (U: a micro-kernel, or one of
// its few-row variants U::WithRows<R>.) bias: the row of column biases at column j (the
// first K chunk only; null for none).
template <class U>
void tile_at(const GemmArgs& g, std::int64_t kc, const float* a, const float* b, std::int64_t i, std::int64_t j,
             std::int64_t m, std::int64_t n, float beta, const float* bias) {
    constexpr std::int64_t MR = U::kMR, NR = U::kNR;
    alignas(64) float bias_pad[NR];
    if (bias != nullptr && n < NR) {  // the columns past C's edge read zeros, not past the bias
        for (std::int64_t x = 0; x < NR; ++x) bias_pad[x] = x < n ? bias[x] : 0.0f;
        bias = bias_pad;
    }
    // Columns [j, j + n) lie in one run of each row unless the tile crosses a column block's
    // edge (GemmArgs::c_block not a multiple of NR).
    const bool one_run = g.c_block <= 0 || j % g.c_block + n <= g.c_block;
    if (m == MR && n == NR && one_run) {
        U::tile(kc, a, b, c_at(g, i, j), g.ldc, beta, bias);
        return;
    }
    // The edge (or a tile across blocks): the same micro-kernel on a scratch tile, so these
    // elements get the same arithmetic as full tiles; only the m × n part is read from and
    // written to C, run by run of each row.
    alignas(64) float t[MR * NR];
    auto runs = [&](bool to_c) {
        for (std::int64_t r = 0; r < m; ++r)
            for (std::int64_t x = 0; x < n;) {
                const std::int64_t len = one_run ? n : std::min(n - x, g.c_block - (j + x) % g.c_block);
                float* c = c_at(g, i + r, j + x);
                std::memcpy(to_c ? c : t + r * NR + x, to_c ? t + r * NR + x : c, static_cast<std::size_t>(len) * sizeof(float));
                x += len;
            }
    };
    if (beta != 0.0f) runs(false);
    U::tile(kc, a, b, t, NR, beta, bias);
    runs(true);
}

// The whole op(B) packed once (PackedB, gemm.hpp): per K chunk pc (the driver's chunks, kc_max
// deep, the last maybe shorter), the ceil(N / NR) slivers of all N columns, sliver q at
// q·NR·depth(kc) — each exactly what pack_b writes for that (chunk, sliver) in a call. (A pair
// micro-kernel's panels: KernelSet::gemm_pack_b_bf16, PackedB::pair_panels.)
template <class U>
const float* packed_sliver(const GemmArgs& g, std::int64_t kc_max, std::int64_t pc, std::int64_t kc, std::int64_t q) {
    const std::int64_t nq = ceil_div(g.N, U::kNR);
    return g.packed_panels + pc * depth<U>(kc_max) * nq * U::kNR + q * U::kNR * depth<U>(kc);
}

// KernelSet::gemm_pack_b: the floats of g's packed op(B); with dst, the panels written there.
template <class U>
std::int64_t gemm_pack_b_all(const GemmArgs& g, float* dst) {
    constexpr std::int64_t NR = U::kNR;
    if (g.K <= 0 || g.N <= 0) return 0;
    const std::int64_t nk = ceil_div(g.K, U::kKC), kc_max = ceil_div(g.K, nk), nq = ceil_div(g.N, NR);
    if (dst == nullptr) return nk * depth<U>(kc_max) * nq * NR;
    // One thread: a weight is packed once per load (a few ms for a 768 x 2304 matrix), often
    // outside any call that names a thread count (a layer's constructor or load_state_dict),
    // where starting a thread pool would break the promise that threads=1 never starts one.
    for (std::int64_t pc = 0; pc < nk; ++pc)
        for (std::int64_t q = 0; q < nq; ++q) {
            const std::int64_t k0 = pc * kc_max, kc = std::min(kc_max, g.K - k0);
            pack_b<U>(g, k0, kc, q * NR, std::min(NR, g.N - q * NR), dst + pc * depth<U>(kc_max) * nq * NR + q * NR * depth<U>(kc));
        }
    return nk * depth<U>(kc_max) * nq * NR;
}

// Few rows (M = R <= kSmallRows: a decode step's projections). The padded path would compute
// MR rows for R, and pack all of op(B) (the weight: S6's 7 MB) into a shared block, written out
// to memory and read back, behind a barrier. Here each thread takes its share of NR-column
// slivers and, per sliver and K chunk, packs just that kc × NR sliver into a buffer of its own
// (L2-resident) right before the R-row micro-kernel reads it: op(B) is read once, nothing is
// written back, no thread waits for another. The arithmetic of every element is the padded
// path's (the same K chunks, the same micro-kernel FMA chain, only fewer rows of it), so a row's
// result does not depend on how many rows share the call, nor on the thread count.
constexpr std::int64_t kSmallRows = 4;

// The caller's flag is set (sgemm throws after the region): a thread skips its blocks left.
inline bool interrupted(const GemmArgs& g) { return g.interrupt != nullptr && g.interrupt->requested(); }

template <class U, int R>
void gemm_few_rows(const GemmArgs& g) {
    using T = typename U::template WithRows<R>;
    constexpr std::int64_t NR = U::kNR;
    static_assert(T::kMR == R && T::kNR == NR, "a few-row variant keeps the micro-kernel's columns");
    const std::int64_t nk = ceil_div(g.K, U::kKC), kc_max = ceil_div(g.K, nk);
    const std::int64_t nq = ceil_div(g.N, NR);
    // The whole team starts, and the first min(team, nq) threads split the slivers: a smaller team
    // would make libgomp end the pool's other threads, and the call's next region create them
    // again, past attn's check (core/startable_threads.hpp).
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    const std::int64_t workers = std::min<std::int64_t>(threads, nq);
    // op(A)'s R rows, every K chunk (R·K floats: tiny), packed by each thread for itself; and
    // the thread's B sliver.
    const std::int64_t a_floats = nk * a_panel_floats<T>(kc_max), b_floats = kc_max * NR;
    const bool prepacked = g.packed_panels != nullptr;
    // A thread refused a buffer (its slot) computes nothing; the refusal is said after the region,
    // which no exception may leave. The other threads' columns of C are written.
    int refused_slot = -1;
#pragma omp parallel num_threads(threads)
    if (const std::int64_t t = omp_get_thread_num(), nt = std::min<std::int64_t>(omp_get_num_threads(), workers); t < nt) {
        const IeeeSubnormals ieee;  // each thread with IEEE subnormals (core/float_env.hpp)
        [[maybe_unused]] const ThreadScopeOf<U> scope;
        float* const abuf = gemm_workspace(0, a_floats);
        float* const bbuf = prepacked ? nullptr : gemm_workspace(1, b_floats);
        if (abuf == nullptr || (!prepacked && bbuf == nullptr)) {
#pragma omp atomic write
            refused_slot = abuf == nullptr ? 0 : 1;
        } else {
            for (std::int64_t pc = 0; pc < nk; ++pc) {
                const std::int64_t k0 = pc * kc_max, kc = std::min(kc_max, g.K - k0);
                pack_a<T>(g, 0, R, k0, kc, abuf + pc * a_panel_floats<T>(kc_max));
            }
            for (std::int64_t q = t * nq / nt; q < (t + 1) * nq / nt && !interrupted(g); ++q) {
                const std::int64_t j = q * NR, n = std::min(NR, g.N - j);
                for (std::int64_t pc = 0; pc < nk; ++pc) {  // in order: an element's chunks add up in K order
                    const std::int64_t k0 = pc * kc_max, kc = std::min(kc_max, g.K - k0);
                    const float* b = bbuf;
                    if (prepacked) b = packed_sliver<U>(g, kc_max, pc, kc, q);
                    else pack_b<U>(g, k0, kc, j, n, bbuf);
                    tile_at<T>(g, kc, abuf + pc * a_panel_floats<T>(kc_max), b, 0, j, R, n, pc == 0 ? g.beta : 1.0f,
                               pc == 0 && g.bias != nullptr ? g.bias + j : nullptr);
                }
            }
        }
    }
    if (refused_slot >= 0) throw_gemm_workspace_refused(refused_slot, refused_slot == 0 ? a_floats : b_floats);
}

template <class U>
void gemm_driver(const GemmArgs& g) {
    constexpr std::int64_t MR = U::kMR, NR = U::kNR;
    if (g.M <= kSmallRows && g.M < MR) {
        switch (g.M) {
            case 1: return gemm_few_rows<U, 1>(g);
            case 2: return gemm_few_rows<U, 2>(g);
            case 3: return gemm_few_rows<U, 3>(g);
            default: return gemm_few_rows<U, 4>(g);
        }
    }
    // K in equal chunks of at most KC (a function of K only: the determinism contract).
    const std::int64_t nk = ceil_div(g.K, U::kKC), kc_max = ceil_div(g.K, nk);
    const std::int64_t nn = ceil_div(g.N, U::kNC), nc_max = ceil_div(ceil_div(g.N, nn), NR) * NR;
    const CacheBlocks blocks = cache_blocks<U>(kc_max, g.M, g.l2_bytes);
    const std::int64_t mc_max = blocks.mc;
    const std::int64_t m_panels = ceil_div(g.M, MR);
    static_assert(U::kMC % MR == 0, "MC blocks of whole panels");
    const std::int64_t a_floats = mc_max / MR * a_panel_floats<U>(kc_max);
    // A pre-packed op(B) (PackedB) is read in place: no packing, and no barriers (nothing shared is written).
    const bool prepacked = g.packed_panels != nullptr;
    float* const bbuf = prepacked ? nullptr : gemm_workspace(1, kc_max * nc_max);
    if (!prepacked && bbuf == nullptr) throw_gemm_workspace_refused(1, kc_max * nc_max);
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    // A thread refused its A buffer computes nothing but still packs its share of B and meets
    // the barriers; the refusal is said after the region, which no exception may leave. The
    // other threads' rows of C are written.
    bool a_refused = false;
#pragma omp parallel num_threads(threads)
    {
        const IeeeSubnormals ieee;  // each thread with IEEE subnormals (core/float_env.hpp)
        [[maybe_unused]] const ThreadScopeOf<U> scope;
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const std::int64_t tm = row_groups(m_panels, nt), tn = nt / tm;
        const std::int64_t ti = t / tn, tj = t % tn;
        const std::int64_t i_begin = std::min(g.M, (ti * m_panels / tm) * MR);
        const std::int64_t i_end = std::min(g.M, ((ti + 1) * m_panels / tm) * MR);
        // This thread's rows in equal MC blocks (a multiple of MR, at most mc_max): each block
        // streams all of the B block once, so a short last block (S6's QKV GEMM on 2 threads:
        // 7 × 144 + 12 rows) would pay a whole pass over B for one micro-panel. Which block a
        // row is in does not change its arithmetic.
        const std::int64_t nblocks = std::max<std::int64_t>(1, ceil_div(i_end - i_begin, mc_max));
        const std::int64_t mc_t = std::min(mc_max, ceil_div(ceil_div(i_end - i_begin, nblocks), MR) * MR);
        float* const abuf = gemm_workspace(0, a_floats);
        if (abuf == nullptr) {
#pragma omp atomic write
            a_refused = true;
        }
        for (std::int64_t jc = 0; jc < nn; ++jc) {
            const std::int64_t j0 = jc * nc_max, nc = std::min(nc_max, g.N - j0), nq = ceil_div(nc, NR);
            const std::int64_t q_begin = tj * nq / tn, q_end = (tj + 1) * nq / tn;
            for (std::int64_t pc = 0; pc < nk; ++pc) {
                const std::int64_t k0 = pc * kc_max, kc = std::min(kc_max, g.K - k0);
                const float beta = pc == 0 ? g.beta : 1.0f;
                const float* const bias = pc == 0 ? g.bias : nullptr;  // into the first chunk's sums
                if (!prepacked) {
#pragma omp for schedule(static)
                    for (std::int64_t q = 0; q < nq; ++q)
                        pack_b<U>(g, k0, kc, j0 + q * NR, std::min(NR, nc - q * NR), bbuf + q * NR * depth<U>(kc));
                    // (the loop's barrier: B is packed before anyone reads it)
                }
                for (std::int64_t i0 = i_begin; i0 < i_end; i0 += mc_t) {
                    const std::int64_t mc = std::min(mc_t, i_end - i0);
                    if (q_begin == q_end || abuf == nullptr || interrupted(g)) break;  // (the barriers are still met)
                    pack_a<U>(g, i0, mc, k0, kc, abuf);
                    for (std::int64_t qb = q_begin; qb < q_end; qb += blocks.slivers) {  // a B block (cache_blocks)
                        const std::int64_t qb_end = std::min(q_end, qb + blocks.slivers);
                        for (std::int64_t p = 0; p < mc; p += MR)
                            for (std::int64_t q = qb; q < qb_end; ++q) {
                                const float* b = prepacked ? packed_sliver<U>(g, kc_max, pc, kc, j0 / NR + q)
                                                           : bbuf + q * NR * depth<U>(kc);
                                const std::int64_t j = j0 + q * NR, n = std::min(NR, g.N - j);
                                tile_at<U>(g, kc, abuf + p / MR * a_panel_floats<U>(kc), b, i0 + p, j, std::min(MR, mc - p), n,
                                          beta, bias != nullptr ? bias + j : nullptr);
                            }
                    }
                }
                if (!prepacked) {
#pragma omp barrier
                    // (nobody repacks B while another thread still reads it)
                }
            }
        }
    }
    if (a_refused) throw_gemm_workspace_refused(0, a_floats);
}

}  // namespace
}  // namespace ATTN_GEMM_NS
}  // namespace attn::detail
