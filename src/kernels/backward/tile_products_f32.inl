// The five products of the backward tile (tile_body.inl) in float32, over the including
// ISA file's hook
//   gemm(M, N, K, a, a_rs, a_ks, b, ldb, c, ldc, accumulate, ahead)
//       C(M×N) (+)= A(M×K)·B(K×N); A(r, k) = a[r·a_rs + k·a_ks]; B, C row-major; N % 8 == 0;
//       ahead (tile.hpp, RowsAhead): lines to request as it goes, or null (the driver gives
//       them to the avx512 tile only; the other rows' gemm ignores them)
// Included inside the ISA file's anonymous namespace, before tile_body.inl.

// S = Q·Kᵀ  (br × bcp, inner Dk); the tile's requests go with S and dP, fused or not
inline void scores_product(const TileArgs& t) {
    gemm(t.br, t.bcp, t.Dk, t.q, t.ldq, 1, t.kt, t.bcp, t.S, t.bcp, false, t.ahead);
}
// dP = dO·Vᵀ  (br × bcp, inner Dv)
inline void dp_product(const TileArgs& t) {
    gemm(t.br, t.bcp, t.Dv, t.dO, t.ldo, 1, t.vt, t.bcp, t.dP, t.bcp, false, t.ahead);
}
// dV += P̂ᵀ·dO  (bc × Dvp, inner br): A(r = key j, k = row i) = P̂[i][j]
inline void dv_product(const TileArgs& t, const float* pv) {
    gemm(t.bc, t.Dvp, t.br, pv, 1, t.bcp, t.dO_dv, t.ldo_dv, t.dv, t.Dvp, !t.dkv_first);
}
// dK += dSᵀ·Q  (bc × Dkp, inner br)
inline void dk_product(const TileArgs& t) {
    gemm(t.bc, t.Dkp, t.br, t.dP, 1, t.bcp, t.q_dk, t.ldq_dk, t.dk, t.Dkp, !t.dkv_first);
}
// dQ += dS·K  (br × Dkp, inner bc)
inline void dq_product(const TileArgs& t) {
    gemm(t.br, t.Dkp, t.bc, t.dP, t.bcp, 1, t.kp, t.Dkp, t.dq, t.lddq, !t.dq_first);
}
