// The backward tile with its five products on bf16 pairs (vdpbf16ps, float32 accumulation):
// KernelSet::backward_tile_bf16 of the avx512 row, called by flash_backward.cpp only when
// Q, K, V, O, dO and the gradients are all bfloat16 and the CPU has AVX-512 BF16 (the forward's
// rule, isa.hpp; docs/conventions.md "bf16 compute" states the bound). This file alone of the
// backward is compiled with ATTN_AVX512_BF16_FLAGS (src/CMakeLists.txt).
//
// The element-wise steps (exp, dS, softcap, dropout, non-finite dO) are tile_body.inl's in
// float32, as on the avx512 row; only the products change. Their operands (tile.hpp,
// TileBf16) are pair words along each product's reduction dimension: Q, K, V, dO are packed
// by the driver (once per task or key block; exact, the inputs are bf16); P̂ and dS, the only
// values rounded here, are packed per tile: P̂ and dS as pairs along the query rows (for
// dV += P̂ᵀ·dO and dK += dSᵀ·Q), dS as bf16 rows (for dQ += dS·K).
//
// GEMM micro-kernel: tile_avx512_gemm.inl's 6×64 block (24 zmm accumulators), as the float32
// tile's, with one vdpbf16ps (two products per lane) where that one has one FMA: per pair
// step, four loads of B pair words, six broadcast A pair words, 24 vdpbf16ps.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../finite.hpp"
#include "../flash/bf16_dot.hpp"
#include "../isa.hpp"
#include "../simd/exp2_avx512.hpp"
#include "../simd/tanh.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

#include "tile_avx512_rows.inl"

#include "tile_avx512_gemm.inl"

#include "tile_bf16_pairs.inl"

// S = Q·Kᵀ over ⌈Dk/2⌉ pairs of d (the padding column of an odd Dk is 0 in both).
inline void scores_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    gemm(t.br, t.bcp, (t.Dk + 1) / 2, words(z.q), z.ldq / 2, 1, z.kt_pairs, t.bcp, t.S, t.bcp, false);
}
// dP = dO·Vᵀ over ⌈Dv/2⌉ pairs of d.
inline void dp_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    gemm(t.br, t.bcp, (t.Dv + 1) / 2, words(z.dO), z.ldo / 2, 1, z.vt_pairs, t.bcp, t.dP, t.bcp, false);
}
// dV += P̂ᵀ·dO over ⌈br/2⌉ pairs of query rows: P̂ rounded to bf16 here.
inline void dv_product(const TileArgs& t, const float* pv) {
    const TileBf16& z = *t.bf16;
    flash_bf16_avx512_ns::pack_pairs_bf16(pv, t.bcp, t.br, t.bcp, z.p_pairs, t.bcp);
    gemm(t.bc, t.Dvp, (t.br + 1) / 2, z.p_pairs, 1, t.bcp, z.dO_pairs, t.Dvp, t.dv, t.Dvp, !t.dkv_first);
}
// dK += dSᵀ·Q over ⌈br/2⌉ pairs of query rows: dS rounded to bf16 here (a tiny scale is not:
// backward_plan.hpp, split_scale).
inline void dk_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    flash_bf16_avx512_ns::pack_pairs_bf16(t.dP, t.bcp, t.br, t.bcp, z.p_pairs, t.bcp);
    gemm(t.bc, t.Dkp, (t.br + 1) / 2, z.p_pairs, 1, t.bcp, z.q_pairs, t.Dkp, t.dk, t.Dkp, !t.dkv_first);
}
// dQ += dS·K over ⌈bc/2⌉ pairs of keys (dS of a padded key is 0, K's pair past an odd bc 0).
inline void dq_product(const TileArgs& t) {
    const TileBf16& z = *t.bf16;
    ds_bf16_rows(t.dP, t.br, t.bcp, z.ds_rows);
    gemm(t.br, t.Dkp, (t.bc + 1) / 2, words(z.ds_rows), t.bcp / 2, 1, z.k_pairs, t.Dkp, t.dq, t.lddq, !t.dq_first);
}

#include "tile_body.inl"

}  // namespace

void backward_tile_avx512_bf16(const TileArgs& t) { tile_body(t); }

}  // namespace attn::detail
