// The one AMX tile configuration of attn's AMX-BF16 kernels (files *_amx_bf16.cpp, compiled
// with ATTN_AMX_BF16_FLAGS; include this header from nowhere else).
//
// Every tile register tmm0..tmm7 is configured full: 16 rows × 64 bytes — 16 × 16 float32
// (an accumulator C), 16 × 32 bf16 (an A operand: 16 rows of 32 elements along the reduction)
// or 16 × 16 pair words (a B operand: 16 pairs along the reduction × 16 columns, the pair
// layout of flash/bf16_dot.hpp). One shape for all, so no kernel reconfigures mid-call: edges
// are zero-padded in scratch instead (a zero bf16 adds exactly 0 to tdpbf16ps's float32 sum).
//
// tdpbf16ps C += A·B: C[m][n] += Σ_k A[m][2k]·B[k][n].lo + A[m][2k+1]·B[k][n].hi, products of
// bf16 exact in float32; bf16 denormal inputs read as 0 and the sums round to nearest even
// with denormal results flushed to 0 (Intel SDM, "TDPBF16PS") — as vdpbf16ps.
//
// A scope (AmxTiles) loads the configuration on entry and releases the tiles on exit
// (TILERELEASE): a thread that leaves its tiles configured keeps 8 KiB more state in every
// context switch, and another library in the process may configure other shapes between
// two of attn's calls, so no configuration is assumed to survive a call. ldtilecfg costs
// far below one key block's work. Scopes may nest (a kernel calling another on the same
// thread): only the outermost loads and releases — an inner ldtilecfg would zero the outer
// scope's accumulators and an inner TILERELEASE leave it with no configuration at all.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace attn::detail {

// Open AmxTiles scopes on this thread, over every *_amx_bf16.cpp file: defined in a generic file
// (core/cpu_features.cpp), constinit so no TLS wrapper function is compiled with AMX flags.
extern thread_local constinit int amx_tiles_depth;

namespace {  // internal linkage: no weak symbol compiled with AMX flags can reach generic code

constexpr int kAmxRows = 16;      // rows per tile
constexpr int kAmxRowBytes = 64;  // bytes per tile row: 16 float32, 32 bf16 or 16 pair words

// The 64-byte operand of ldtilecfg (palette 1): byte 0 palette, 1 start row, 16.. column bytes
// of tmm0..15 (uint16 each), 48.. rows of tmm0..15 (uint8 each).
struct alignas(64) AmxTileConfig {
    std::uint8_t palette = 1;
    std::uint8_t start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
};

// Tile loads go through this macro, never GCC 12's _tile_loadd: that one is an asm with the
// address as a register operand and no memory clobber, so the compiler does not know it reads
// memory — stores to what it reads (a packed panel, a zero-padded step) may be sunk past it or
// dropped as dead (the AMX GEMM gave wrong sums on every K not a multiple of 32 that way). The
// "memory" clobber orders every earlier store before the load. (_tile_stored has the clobber.)
// tmm: the tile number as a literal (it is pasted into the instruction).
#define ATTN_TILE_LOAD(tmm, base, stride)                                                   \
    __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #tmm "|tileloadd\t%%tmm" #tmm ", [%0+%1*1]}" \
                     ::"r"((const void*)(base)), "r"((long)(stride))                        \
                     : "memory")

class AmxTiles {
public:
    AmxTiles() {
        if (amx_tiles_depth++ > 0) return;
        AmxTileConfig c;
        for (int t = 0; t < 8; ++t) {
            c.colsb[t] = kAmxRowBytes;
            c.rows[t] = kAmxRows;
        }
        // Not GCC 12's _tile_loadconfig: its asm names only the first 8 bytes of the operand as
        // read, so the compiler may store the rest of c after the ldtilecfg (it did, in the
        // bench's peak loop: #GP on a half-written configuration). The whole struct as the operand.
        __asm__ volatile("ldtilecfg %0" ::"m"(c));
    }
    ~AmxTiles() {
        if (--amx_tiles_depth == 0) _tile_release();
    }
    AmxTiles(const AmxTiles&) = delete;
    AmxTiles& operator=(const AmxTiles&) = delete;
};

}  // namespace
}  // namespace attn::detail
