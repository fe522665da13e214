// The element-wise row steps of the AVX-512 backward tiles (tile_body.inl's exp_row and
// ds_row hooks), shared by the float32 tile (tile_avx512.cpp) and the bf16-products tile
// (tile_avx512_bf16.cpp); both compile them with the AVX-512 flags. Included inside their
// anonymous namespace; needs <immintrin.h> and simd/exp2_avx512.hpp.

// The first n lanes (n >= 16: all).
inline __mmask16 lanes(int n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u); }

void exp_row(float* s, int n, float scale, float neg_lse) {
    const __m512 vs = _mm512_set1_ps(scale), vn = _mm512_set1_ps(neg_lse), l2e = _mm512_set1_ps(kTileLog2e);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int j = 0; j < n; j += 16) {  // n % 8 == 0: the last step may be 8 lanes
        const __mmask16 m = lanes(n - j);
        const __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, s + j), vs, vn);
        // P <= 1 (tile.hpp): min(1, p) keeps a NaN p
        _mm512_mask_storeu_ps(s + j, m, _mm512_min_ps(one, exp2_ps512(_mm512_mul_ps(x, l2e))));
    }
}

void ds_row(const float* p, float* dp, int n, float D, float scale) {
    const __m512 vd = _mm512_set1_ps(D), vs = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        const __mmask16 m = lanes(n - j);
        const __m512 pv = _mm512_maskz_loadu_ps(m, p + j);
        const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(vs, pv), _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dp + j), vd));
        // p = 0 → exactly 0 (a masked key: select, never 0·inf)
        _mm512_mask_storeu_ps(dp + j, m, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(pv, zero, _CMP_NEQ_UQ), ds));
    }
}

