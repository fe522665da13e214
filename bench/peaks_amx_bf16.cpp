// The AMX-BF16 ceiling (tdpbf16ps on tiles): built with the AMX flags, called only after
// cpu_has_amx_bf16() said yes (which includes the OS's grant of the tile state). The loop of the
// flash forward's tiles without their loads: C tiles tmm0..5, each an independent chain
// C += A·B with the A and B tiles tmm6, tmm7 loaded once. A tdpbf16ps is 16 × 16 float32 lanes ×
// 32 bf16 products and their sums = 2·16·16·32 = 16384 FLOP; six chains cover its latency.
// The configuration is attn's one (kernels/simd/amx_tiles.hpp): every tile 16 rows × 64 bytes.
#include <immintrin.h>

#include <cstdint>

#include "kernels/simd/amx_tiles.hpp"
#include "peaks.hpp"

namespace attn::bench::detail {

float tdpbf16_chains_amx(long iters) {
    const attn::detail::AmxTiles tiles;
    // A = 1.0 and B = 2^-7 in every bf16: each step adds 32·2^-7 = 0.25 to every lane, so the
    // values stay finite for any iteration count a trial uses, and depend on every step.
    alignas(64) std::uint16_t a[16 * 32], b[16 * 32];
    for (int i = 0; i < 16 * 32; ++i) {
        a[i] = 0x3f80;
        b[i] = 0x3c00;
    }
    alignas(64) float c[16 * 16] = {};
    ATTN_TILE_LOAD(6, a, 64);
    ATTN_TILE_LOAD(7, b, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    for (long i = 0; i < iters; ++i) {
        _tile_dpbf16ps(0, 6, 7);
        _tile_dpbf16ps(1, 6, 7);
        _tile_dpbf16ps(2, 6, 7);
        _tile_dpbf16ps(3, 6, 7);
        _tile_dpbf16ps(4, 6, 7);
        _tile_dpbf16ps(5, 6, 7);
    }
    float t = 0.0f;
    _tile_stored(0, c, 64);
    t += c[0];
    _tile_stored(5, c, 64);
    t += c[255];
    return t;
}

}  // namespace attn::bench::detail
