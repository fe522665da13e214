// The tile of the tiled backward, written once over ISA hooks the including file defines
// in its own anonymous namespace:
//   the five products (tile_products_f32.inl over the ISA's float32 gemm, or the bf16 ones
//   of tile_avx512_bf16.cpp): scores_product(t): S = Q·Kᵀ; dp_product(t): dP = dO·Vᵀ;
//   dv_product(t, pv): dV += P̂ᵀ·dO; dk_product(t): dK += dSᵀ·Q; dq_product(t): dQ += dS·K
//   exp_row(s, n, scale, neg_lse)            s[j] ← 2^((s[j]·scale + neg_lse)·log2 e)   (the ISA's exp2)
//   ds_row(p, dp, n, D, scale)               dp[j] ← p[j] = 0 ? 0 : scale·p[j]·(dp[j] − D)
//   and optionally, as overloads on TileArgs defined before this file (tile_avx512.cpp):
//   fused_scores_exp(t): S = Q·Kᵀ with P = exp_row's value in the product's stores;
//   fused_dp_ds(t): dP = dO·Vᵀ with dS = ds_row's value in the product's stores
//   (each the same bits as the product and its row pass, one pass over S or dP fewer: bwd-8).
// Included inside an anonymous namespace; needs <cstddef>.

// What a file without those overloads calls (a non-template overload wins): not fused, so the
// tile runs the product and its row pass.
template <class T>
bool fused_scores_exp(const T&) { return false; }
template <class T>
bool fused_dp_ds(const T&) { return false; }

void tile_body(const TileArgs& t) {
    const int br = t.br, bc = t.bc, bcp = t.bcp;
    // S = Q·Kᵀ  (br × bcp, inner Dk)
    // P = exp(rule(S·scale) − lse) = 2^((rule(S·scale) − lse)·log2 e), lse subtracted first
    // (tile.hpp, kTileLog2e) (a dead row has −lse = −inf → 0); padded keys → 0. With no score
    // rule, no softcap and no padded key, P straight from S where the ISA's products can.
    const bool p_fused = !t.score_rule && t.softcap == 0.0f && bc == bcp && fused_scores_exp(t);
    if (!p_fused) scores_product(t);
    for (int i = 0; i < (p_fused ? 0 : br); ++i) {
        float* s = t.S + static_cast<std::ptrdiff_t>(i) * bcp;
        if (t.softcap > 0.0f) {  // scale and cap (keeping 1 − tanh²), then ALiBi and masks
            scaled_softcap_f32(s, bcp, t.scale, t.softcap, t.softcap_inv,
                               t.softcap_grad + static_cast<std::ptrdiff_t>(i) * bcp);
            if (t.score_rule) t.score_rule(t.rule_ctx, i, s);
            exp_row(s, bcp, 1.0f, t.neg_lse[i]);
        } else if (t.score_rule) {
            t.score_rule(t.rule_ctx, i, s);
            exp_row(s, bcp, 1.0f, t.neg_lse[i]);
        } else {
            exp_row(s, bcp, t.scale, t.neg_lse[i]);
        }
        for (int j = bc; j < bcp; ++j) s[j] = 0.0f;
    }
    // dP = dO·Vᵀ  (br × bcp, inner Dv); with no dropout and no softcap, dS below straight from
    // dP where the ISA's products can (dV reads P, not dP: it may come after)
    const bool ds_fused = !t.drop && !t.softcap_grad && fused_dp_ds(t);
    if (!ds_fused) dp_product(t);
    // Dropout: O used P̂ = P∘Z/(1−p), so dV takes P̂ and dP picks up the same factor.
    const float* pv = t.S;
    if (t.drop) {
        for (std::ptrdiff_t e = 0; e < static_cast<std::ptrdiff_t>(br) * bcp; ++e) {
            t.Pd[e] = t.S[e] * t.drop[e];
            t.dP[e] *= t.drop[e];
        }
        pv = t.Pd;
    }
    // dV += P̂ᵀ·dO  (bc × Dvp, inner br): A(r = key j, k = row i) = P̂[i][j]
    dv_product(t, pv);
    if (t.dO_nonfinite) {  // the NaN/±inf entries of dO, where P̂ is not 0 (select, not 0·inf)
        for (int i = 0; i < br; ++i)
            for (int d = 0; d < t.Dv; ++d) {
                const float x = t.dO[static_cast<std::ptrdiff_t>(i) * t.ldo + d];
                if (nonfinite_f32(x))
                    for (int j = 0; j < bc; ++j) {
                        const float pij = pv[static_cast<std::ptrdiff_t>(i) * bcp + j];
                        if (pij != 0.0f) t.dv[static_cast<std::ptrdiff_t>(j) * t.Dvp + d] += pij * x;
                    }
            }
    }
    // dS = ds_scale · P∘(dP − Dᵢ)   (the driver applies the rest of the scale to dQ and dK)
    for (int i = 0; i < (ds_fused ? 0 : br); ++i) {
        const std::ptrdiff_t o = static_cast<std::ptrdiff_t>(i) * bcp;
        ds_row(t.S + o, t.dP + o, bcp, t.Drow[i], t.ds_scale);
    }
    // Softcap: ∂(c·tanh(s/c))/∂s = 1 − tanh²(s/c)
    if (t.softcap_grad)
        for (std::ptrdiff_t e = 0; e < static_cast<std::ptrdiff_t>(br) * bcp; ++e) t.dP[e] *= t.softcap_grad[e];
    // dK += dSᵀ·Q  (bc × Dkp, inner br)
    dk_product(t);
    // dQ += dS·K  (br × Dkp, inner bc)
    dq_product(t);
}
