// AVX-512 tile of the tiled backward. The only backward file compiled with the AVX-512
// flags (src/CMakeLists.txt: ATTN_AVX512_SOURCES); reached only through the kernel table's
// avx512 row (isa.cpp). The tile itself is tile_body.inl, shared with the other ISAs.
//
// GEMM micro-kernel (tile_avx512_gemm.inl): a 6×64 block of C in 24 zmm accumulators; per
// k, four loads of a B row and six A scalars broadcast from memory feed 24 FMAs — 24
// independent chains cover 2 FMA pipes × 4 cycles of latency three times over, with 10 loads
// per 24 FMAs (the gemm file says why that form).
#include <immintrin.h>

#include <cstddef>

#include "../finite.hpp"
#include "../isa.hpp"
#include "../simd/exp2_avx512.hpp"
#include "../simd/tanh.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

#include "tile_avx512_rows.inl"

#include "tile_avx512_gemm.inl"

// float32 A and B: one FMA per accumulator and k.
template <>
struct UkernelOps<float> {
    using AVec = __m512;
    using BVec = __m512;
    static __m512 load(const float* b) { return _mm512_loadu_ps(b); }
    static __m512 load(__mmask16 m, const float* b) { return _mm512_maskz_loadu_ps(m, b); }
    static constexpr bool kIndexFirst = true;
    static __m512 broadcast(const float* a) { return _mm512_set1_ps(*a); }
    static __m512 madd(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
};

#include "tile_products_f32.inl"
#include "tile_body.inl"

}  // namespace

void backward_tile_avx512(const TileArgs& t) { tile_body(t); }

}  // namespace attn::detail
