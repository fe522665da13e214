// The element-wise row steps of the AVX-512 backward tiles (tile_body.inl's exp_row and
// ds_row hooks), shared by the float32 tile (tile_avx512.cpp) and the bf16-products tile
// (tile_avx512_bf16.cpp); both compile them with the AVX-512 flags. Included inside their
// anonymous namespace; needs <immintrin.h> and simd/exp2_avx512.hpp.

// The first n lanes (n >= 16: all).
inline __mmask16 lanes(int n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u); }

// P = min(1, 2^((s·scale + neg_lse)·log2 e)) of 16 scores s (P <= 1: tile.hpp; min keeps a NaN
// p). exp_row's step, and the S product's store step where tile_body.inl fuses them.
inline __m512 exp_scores(__m512 s, __m512 scale, __m512 neg_lse) {
    const __m512 x = _mm512_fmadd_ps(s, scale, neg_lse);
    return _mm512_min_ps(_mm512_set1_ps(1.0f), exp2_ps512(_mm512_mul_ps(x, _mm512_set1_ps(kTileLog2e))));
}

// dS = scale·p·(dp − D) of 16 scores; exactly 0 where p = 0 (a masked key: select, never
// 0·inf). ds_row's step, and the dP product's store step where tile_body.inl fuses them.
inline __m512 ds_scores(__m512 p, __m512 dp, __m512 D, __m512 scale) {
    const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(scale, p), _mm512_sub_ps(dp, D));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ), ds);
}

void exp_row(float* s, int n, float scale, float neg_lse) {
    const __m512 vs = _mm512_set1_ps(scale), vn = _mm512_set1_ps(neg_lse);
    for (int j = 0; j < n; j += 16) {  // n % 8 == 0: the last step may be 8 lanes
        const __mmask16 m = lanes(n - j);
        _mm512_mask_storeu_ps(s + j, m, exp_scores(_mm512_maskz_loadu_ps(m, s + j), vs, vn));
    }
}

void ds_row(const float* p, float* dp, int n, float D, float scale) {
    const __m512 vd = _mm512_set1_ps(D), vs = _mm512_set1_ps(scale);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 m = lanes(n - j);
        _mm512_mask_storeu_ps(dp + j, m, ds_scores(_mm512_maskz_loadu_ps(m, p + j), _mm512_maskz_loadu_ps(m, dp + j), vd, vs));
    }
}
