// The GEMM of the AVX-512 backward tiles: one 8×32 micro-kernel (16 zmm accumulators) and its
// loop over column panels and row blocks, shared by the float32 tile (tile_avx512.cpp) and the
// bf16-products tile (tile_avx512_bf16.cpp), which differ only in the element of A and B and
// in the one multiply-add per accumulator (an FMA, or a vdpbf16ps on pair words). Written once
// so that a change to the blocking, the N-edge masks or the row dispatch reaches both tiles.
//
// Included inside the tile file's anonymous namespace, after tile_avx512_rows.inl (lanes()),
// with a specialisation of
//   template <class Elem> struct UkernelOps {
//       using AVec, BVec;                       // one broadcast A element, one vector of B
//       static BVec load(const Elem* b);        // 16 elements of a B row
//       static BVec load(__mmask16 m, const Elem* b);  // the lanes of m, the others 0
//       static AVec broadcast(const Elem* p);   // *p = A(r, k) in every lane
//       static constexpr bool kIndexFirst;      // how &A(r, k) is summed (below)
//       static __m512 madd(__m512 acc, AVec a, BVec b);  // acc + a·b, lane-wise
//   };
// for the file's Elem (the template is declared here), defined before the file's first gemm call.
// kIndexFirst: &A(r, k) as a + (r·a_rs + k·a_ks) (true) or (a + r·a_rs) + k·a_ks (false). The
// same address, but GCC allocates registers differently for the two sums; each tile keeps the
// sum it was written with, so that sharing this code changed no instruction of either tile
// (objdump -d, per function) — the float32 tile sums index first, the bf16 one pointer first.
//
// 8 rows divide the 64-row query block and 64-key block; the N edge (N % 8 == 0, not always
// % 16) is a masked last vector, so no column is read or written past N.

template <class Elem>
struct UkernelOps;

// Accumulators are named variables, not an array (the AVX2 tile's comment says why).
// C(MR × 16·NV) (+)= Σ_{k < K} A(r, k) · B(k, ·); A(r, k) = a[r·a_rs + k·a_ks], B rows with
// stride ldb; NV vectors of 16 columns, the last one under `last` (all ones, or the N edge).
template <int MR, int NV, class Elem>
inline void ukernel(int K, const Elem* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const Elem* b,
                    std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate, __mmask16 last) {
    static_assert(MR >= 1 && MR <= 8 && (NV == 1 || NV == 2));
    using Ops = UkernelOps<Elem>;
    using AVec = typename Ops::AVec;
    using BVec = typename Ops::BVec;
    const __mmask16 m0 = NV == 1 ? last : static_cast<__mmask16>(0xFFFF);
    const __mmask16 m1 = last;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
#define ATTN_ROWS(X) \
    X(0, c00, c01) X(1, c10, c11) X(2, c20, c21) X(3, c30, c31) X(4, c40, c41) X(5, c50, c51) X(6, c60, c61) X(7, c70, c71)
#define ATTN_LOAD(r, x0, x1)                                                    \
    if constexpr (MR > r) {                                                     \
        x0 = _mm512_maskz_loadu_ps(m0, c + r * ldc);                            \
        if constexpr (NV == 2) x1 = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16); \
    }
    if (accumulate) { ATTN_ROWS(ATTN_LOAD) }
#define ATTN_MADD(r, x0, x1)                                                    \
    if constexpr (MR > r) {                                                     \
        const AVec av = Ops::broadcast(Ops::kIndexFirst ? &a[r * a_rs + o] : a + r * a_rs + o); \
        x0 = Ops::madd(x0, av, b0);                                             \
        if constexpr (NV == 2) x1 = Ops::madd(x1, av, b1);                      \
    }
    std::ptrdiff_t o = 0;
    for (int k = 0; k < K; ++k, o += a_ks, b += ldb) {
        const BVec b0 = NV == 1 ? Ops::load(m0, b) : Ops::load(b);
        const BVec b1 = NV == 2 ? Ops::load(m1, b + 16) : b0;
        ATTN_ROWS(ATTN_MADD)
    }
#define ATTN_STORE(r, x0, x1)                                                   \
    if constexpr (MR > r) {                                                     \
        _mm512_mask_storeu_ps(c + r * ldc, m0, x0);                             \
        if constexpr (NV == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, x1); \
    }
    ATTN_ROWS(ATTN_STORE)
#undef ATTN_ROWS
#undef ATTN_LOAD
#undef ATTN_MADD
#undef ATTN_STORE
}

template <int NV, class Elem>
inline void ukernel_rows(int mr, int K, const Elem* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const Elem* b,
                         std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool acc, __mmask16 last) {
    switch (mr) {
        case 8: ukernel<8, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 7: ukernel<7, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 6: ukernel<6, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 5: ukernel<5, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 4: ukernel<4, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 3: ukernel<3, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        case 2: ukernel<2, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
        default: ukernel<1, NV>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last); break;
    }
}

// C(M×N) (+)= A(M×K)·B(K×N), N % 8 == 0. Column panels of 32 outermost so a K×32 panel
// of B stays in L1 while the row blocks stream past it; the last panel (8, 16 or 24
// columns) runs under a mask.
template <class Elem>
void gemm(int M, int N, int K, const Elem* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const Elem* b,
          std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate) {
    for (int n0 = 0; n0 < N; n0 += 32) {
        const int w = N - n0 < 32 ? N - n0 : 32;
        for (int m0 = 0; m0 < M; m0 += 8) {
            const int mr = M - m0 < 8 ? M - m0 : 8;
            if (w > 16)
                ukernel_rows<2>(mr, K, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate,
                                lanes(w - 16));
            else
                ukernel_rows<1>(mr, K, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate,
                                lanes(w));
        }
    }
}
