// The AMX-BF16 micro-kernels (amx_dot.hpp says what they compute and in which layouts).
// This file alone is compiled with ATTN_AMX_BF16_FLAGS (src/CMakeLists.txt:
// ATTN_AMX_BF16_SOURCES); it holds no driver code, only the functions of amx_dot.hpp, reached
// from the avx512 row's AMX Ops (flash_avx512.cpp) on a CPU with AMX-BF16.
//
// Tile registers, both kernels: tmm0..3 the four C tiles of a 2 × 2 block, tmm4..5 the two A
// tiles, tmm6..7 the two B tiles. Per 32-element reduction step 4 tileloads feed 4 tdpbf16ps
// (16·16·32 products each): a tile load is 16 rows of 64 bytes, a tdpbf16ps 16 cycles of the
// TMUL unit, so the loads keep up with the products.
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "../simd/amx_tiles.hpp"
#include "amx_dot.hpp"

namespace attn::detail::flash_amx_bf16_ns {
namespace {

constexpr int kTile = 16 * 16;  // floats of one C tile in cbuf (rows of 64 bytes)

// rows × 16 floats of a staged C tile (row stride 16) to s (row stride ldS), times c2; returns
// max(mx, the stored values) per column (two chains: the max's latency).
inline __m512 store_scaled(const float* c, int rows, __m512 c2, float* s, int ldS, __m512 mx) {
    __m512 m1 = mx;
    int r = 0;
    for (; r + 2 <= rows; r += 2) {
        const __m512 x0 = _mm512_mul_ps(_mm512_load_ps(c + 16 * r), c2);
        const __m512 x1 = _mm512_mul_ps(_mm512_load_ps(c + 16 * r + 16), c2);
        _mm512_storeu_ps(s + r * ldS, x0);
        _mm512_storeu_ps(s + (r + 1) * ldS, x1);
        mx = _mm512_max_ps(mx, x0);
        m1 = _mm512_max_ps(m1, x1);
    }
    if (r < rows) {
        const __m512 x0 = _mm512_mul_ps(_mm512_load_ps(c + 16 * r), c2);
        _mm512_storeu_ps(s + r * ldS, x0);
        mx = _mm512_max_ps(mx, x0);
    }
    return _mm512_max_ps(mx, m1);
}

// max(mx, the 16 rows of a C tile just stored to s (row stride ldS)) per column: the loads
// hit L1 (two chains: the max's latency).
inline __m512 max_of_rows(const float* s, int ldS, __m512 mx) {
    __m512 m1 = mx;
    for (int r = 0; r < 16; r += 2) {
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + r * ldS));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + (r + 1) * ldS));
    }
    return _mm512_max_ps(mx, m1);
}

// C tile I (0..3, a literal: it is pasted into the instruction) to Sᵀ at st, and mx = max(mx,
// the stored values) per column: a whole tile (rows == 16) unscaled (c2 == 1) straight from the
// tile register, its max read back from L1 later (`late`: qk_amx reads it while the next pair's
// products run — right after the store the loads would wait for it); else staged in cbuf slot I
// and stored times c2, the first `rows` rows only, its max taken on the way. (A macro:
// _tile_stored takes the tile number as a literal.)
#define ATTN_STORE_S_TILE(I, rows, st, mx, late)                                   \
    do {                                                                           \
        if ((rows) == 16 && c2 == 1.0f) {                                          \
            _tile_stored(I, st, static_cast<long>(ldS) * 4);                       \
            late = true;                                                           \
        } else {                                                                   \
            _tile_stored(I, cbuf + (I) * kTile, 64);                               \
            mx = store_scaled(cbuf + (I) * kTile, rows, vc, st, ldS, mx);          \
        }                                                                          \
    } while (0)

// One 32-element reduction step of the 2 × 2 block: B tiles 6, 7 (queries 0..15 and 16..31 of
// the panel) from b and b + 16 words, A tile 4 from a0 into C tiles 0, 1 and — unless this is
// the last A tile of an odd count (`two` false) — A tile 5 from a1 into C tiles 2, 3.
inline void step_2x2(const std::uint32_t* b, long b_stride, const void* a0, long a0_stride, const void* a1, long a1_stride,
                     bool two) {
    ATTN_TILE_LOAD(6, b, b_stride);
    ATTN_TILE_LOAD(7, b + 16, b_stride);
    ATTN_TILE_LOAD(4, a0, a0_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
        ATTN_TILE_LOAD(5, a1, a1_stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
}

}  // namespace

void qk_amx(const std::uint32_t* qt, int Dq, int panels, const std::uint16_t* k, std::int64_t ldk,
            const std::uint16_t* ktail, int nk, float c2, float* s, int ldS, float* cbuf, float* colmax) {
    const AmxTiles tiles;
    const int whole = nk / 16, ktiles = (nk + 15) / 16, dsteps = Dq / 16;
    const __m512 vc = _mm512_set1_ps(c2);
    // Key tile t: its first row and the row stride in bytes.
    auto a_rows = [&](int t, long& stride) -> const std::uint16_t* {
        if (t < whole) {
            stride = static_cast<long>(ldk) * 2;
            return k + static_cast<std::int64_t>(t) * 16 * ldk;
        }
        stride = static_cast<long>(Dq) * 4;
        return ktail;
    };
    for (int pn = 0; pn < panels; ++pn) {
        const std::uint32_t* q = qt + static_cast<std::int64_t>(pn) * Dq * 32;
        __m512 mx0 = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), mx1 = mx0;  // the panel's two 16-query halves
        // The previous pair's tiles stored straight from the registers, their max not yet read:
        // key tile rows at late_st (tiles 0, 1) and late_st + 16 rows (tiles 2, 3).
        const float* late_st = nullptr;
        bool late0 = false, late1 = false;
        auto read_late = [&] {
            if (late0) {
                mx0 = max_of_rows(late_st, ldS, mx0);
                mx1 = max_of_rows(late_st + 16, ldS, mx1);
            }
            if (late1) {
                mx0 = max_of_rows(late_st + 16 * ldS, ldS, mx0);
                mx1 = max_of_rows(late_st + 16 * ldS + 16, ldS, mx1);
            }
        };
        for (int t = 0; t < ktiles; t += 2) {
            const bool two = t + 1 < ktiles;
            long s0 = 0, s1 = 0;
            const std::uint16_t* a0 = a_rows(t, s0);
            const std::uint16_t* a1 = two ? a_rows(t + 1, s1) : nullptr;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int ds = 0; ds < dsteps; ++ds)  // B: pair rows 16·ds.. of the panel (128-byte rows)
                step_2x2(q + ds * 16 * 32, 128, a0 + ds * 32, s0, two ? a1 + ds * 32 : nullptr, s1, two);
            read_late();  // the last pair's max, while this pair's products run
            // Only the rows of real keys reach Sᵀ (nk rows, not necessarily a multiple of 16).
            float* st = s + static_cast<std::int64_t>(t) * 16 * ldS + pn * 32;
            late_st = st;
            late0 = late1 = false;
            const int r0 = nk - t * 16 < 16 ? nk - t * 16 : 16;
            ATTN_STORE_S_TILE(0, r0, st, mx0, late0);
            ATTN_STORE_S_TILE(1, r0, st + 16, mx1, late0);
            if (two) {
                const int r1 = nk - (t + 1) * 16 < 16 ? nk - (t + 1) * 16 : 16;
                ATTN_STORE_S_TILE(2, r1, st + 16 * ldS, mx0, late1);
                ATTN_STORE_S_TILE(3, r1, st + 16 * ldS + 16, mx1, late1);
            }
        }
        read_late();
        _mm512_store_ps(colmax + pn * 32, mx0);
        _mm512_store_ps(colmax + pn * 32 + 16, mx1);
    }
}
#undef ATTN_STORE_S_TILE

void pv_amx(const std::uint32_t* pp, int ldP, const std::uint32_t* vt, int Jq, int Dv, int panels, float* acc, int ldO,
            float* cbuf) {
    const AmxTiles tiles;
    const int whole = Dv / 16, dtiles = (Dv + 15) / 16, ksteps = Jq / 16;
    const long sp = static_cast<long>(ldP) * 4, sv = 64;      // Vᵀ tiles: rows of 16 words in one piece
    const std::int64_t unit = static_cast<std::int64_t>(dtiles) * 16 * 16;  // words per 32-key unit
    // C tile i (of the 2 × 2 block) for head-dim tile dt, query half h: in place in acc when
    // its 16 rows are all < Dv, else staged in cbuf slot i (the rows past Dv zero; copied back).
    float* at[4];
    long stride[4];
    int rows[4];
    auto c_tile = [&](int i, int dt, float* a) {
        rows[i] = Dv - dt * 16 < 16 ? Dv - dt * 16 : 16;
        if (dt < whole) {
            at[i] = a;
            stride[i] = static_cast<long>(ldO) * 4;
            return;
        }
        float* c = cbuf + i * kTile;
        for (int r = 0; r < 16; ++r)
            _mm512_store_ps(c + 16 * r, r < rows[i] ? _mm512_loadu_ps(a + static_cast<std::int64_t>(r) * ldO) : _mm512_setzero_ps());
        at[i] = c;
        stride[i] = 64;
    };
    auto put_back = [&](int i, float* a) {
        if (at[i] == a) return;
        for (int r = 0; r < rows[i]; ++r) _mm512_storeu_ps(a + static_cast<std::int64_t>(r) * ldO, _mm512_load_ps(at[i] + 16 * r));
    };
    // Head-dim tile pairs outer, panels inner: a pair's Vᵀ tiles (16 KiB for 256 keys) stay in
    // L1 for every panel, Pᵀ is read once per pair (kernels-lab fwd-23: level to +1 %; the same sums).
    for (int dt = 0; dt < dtiles; dt += 2) {
        for (int pn = 0; pn < panels; ++pn) {
            const std::uint32_t* p = pp + pn * 32;
            const bool two = dt + 1 < dtiles;
            float* o0 = acc + static_cast<std::int64_t>(dt) * 16 * ldO + pn * 32;
            float* o1 = two ? o0 + static_cast<std::int64_t>(16) * ldO : nullptr;
            c_tile(0, dt, o0);
            c_tile(1, dt, o0 + 16);
            ATTN_TILE_LOAD(0, at[0], stride[0]);
            ATTN_TILE_LOAD(1, at[1], stride[1]);
            if (two) {
                c_tile(2, dt + 1, o1);
                c_tile(3, dt + 1, o1 + 16);
                ATTN_TILE_LOAD(2, at[2], stride[2]);
                ATTN_TILE_LOAD(3, at[3], stride[3]);
            }
            const std::uint32_t* v0 = vt + dt * 16 * 16;
            const std::uint32_t* v1 = two ? v0 + 16 * 16 : nullptr;
            for (int ks = 0; ks < ksteps; ++ks)  // B: pair rows 16·ks.. (keys 32·ks..) of the panel; A: unit ks
                step_2x2(p + static_cast<std::int64_t>(ks) * 16 * ldP, sp, v0 + ks * unit, sv, two ? v1 + ks * unit : nullptr,
                         sv, two);
            _tile_stored(0, at[0], stride[0]);
            _tile_stored(1, at[1], stride[1]);
            put_back(0, o0);
            put_back(1, o0 + 16);
            if (two) {
                _tile_stored(2, at[2], stride[2]);
                _tile_stored(3, at[3], stride[3]);
                put_back(2, o1);
                put_back(3, o1 + 16);
            }
        }
    }
}

}  // namespace attn::detail::flash_amx_bf16_ns
