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

// exp_row in the S product's stores (tile_body.inl calls it only where no score rule, softcap or
// padded key applies): P of row `row` from its summed scores, as exp_row computes it.
struct ExpInStore {
    const float* neg_lse;  // (br)
    __m512 scale;
    __m512 operator()(int row, int, __mmask16, __m512 s) const { return exp_scores(s, scale, _mm512_set1_ps(neg_lse[row])); }
};
// ds_row in the dP product's stores (no dropout, no softcap): dS from the summed dP and P.
struct DsInStore {
    const float* p;  // (br, ldp): P, the tile's S after the exp
    std::ptrdiff_t ldp;
    const float* D;  // (br)
    __m512 scale;
    __m512 operator()(int row, int col, __mmask16 m, __m512 dp) const {
        return ds_scores(_mm512_maskz_loadu_ps(m, p + row * ldp + col), dp, _mm512_set1_ps(D[row]), scale);
    }
};
bool fused_scores_exp(const TileArgs& t) {
    gemm(t.br, t.bcp, t.Dk, t.q, t.ldq, 1, t.kt, t.bcp, t.S, t.bcp, false, t.ahead,
         ExpInStore{t.neg_lse, _mm512_set1_ps(t.scale)});
    return true;
}
bool fused_dp_ds(const TileArgs& t) {
    gemm(t.br, t.bcp, t.Dv, t.dO, t.ldo, 1, t.vt, t.bcp, t.dP, t.bcp, false, t.ahead,
         DsInStore{t.S, t.bcp, t.Drow, _mm512_set1_ps(t.ds_scale)});
    return true;
}

#include "tile_body.inl"

}  // namespace

void backward_tile_avx512(const TileArgs& t) { tile_body(t); }

}  // namespace attn::detail
