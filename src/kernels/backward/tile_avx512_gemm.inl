// The GEMM of the AVX-512 backward tiles: one 6×64 micro-kernel (24 zmm accumulators) and its
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
// Why 6×64: per step of k it loads 4 vectors of B and broadcasts 6 elements of A for 24 FMAs —
// 10 loads per 24 FMAs, where the 8×32 block it replaced loaded 10 per 16 and 12×32 14 per 24.
// On Sapphire Rapids the loads, not the FMAs' latency, held the products back: hot in L1, K = 64
// per call as in the tile, 8×32 ran at 78 % of the FMA peak, 12×32 at 80 %, 4×64 at 79 %, 6×64
// at 83.5 % (docs/kernels-lab.md#bwd-5). 24 accumulators + 4 B vectors + 1 broadcast = 29 of 32
// zmm; 24 independent chains cover any FMA latency × pipes of Zen 4/5 as the 16 did, with fewer
// loads per FMA, so the form is no slower there in principle. Each element of C still sums its
// k in order from its loaded (or zero) value, so the blocking changes no bit of any result.
//
// 64 columns are the 64-key block (S, dP) and head dims 64 and 128 (dV, dK, dQ) whole; the N
// edge (N % 8 == 0, not always % 16) is a masked last vector of a narrower block (1–4
// vectors), so no column is read or written past N. Rows go 6 at a time (64 = 10·6 + 4).

template <class Elem>
struct UkernelOps;

// What the micro-kernel does to each vector of C before it stores it: epi(row, col, m, x) for
// the 16 columns from col of row `row` of the whole C (the lanes of m inside it). StoreAsIs for
// the products; the float32 tile's S and dP products take P and dS there (tile_avx512.cpp).
struct StoreAsIs {
    __m512 operator()(int, int, __mmask16, __m512 x) const { return x; }
};

// C's row stride fixed at compile time (the common 64 and 128: ukernel_panel), where a run-time
// ldc made GCC compute the 24 accumulators' addresses one by one around the k loop and keep a
// dozen of them on the stack or in xmm registers (objdump at 0b14987: ≈ 60 instructions and ≈ 20
// stack moves a call); a fixed one addresses them all as displacements from c. With the first
// writes of dK/dV/dQ, S1 +2.4 % per CPU-second, S3 level (kernels-lab.md#bwd-8).
template <std::ptrdiff_t N>
struct FixedStride {
    constexpr operator std::ptrdiff_t() const { return N; }
};

// Accumulators are named variables, not an array (the AVX2 tile's comment says why).
// C(MR × 16·NV) (+)= Σ_{k < K} A(r, k) · B(k, ·); A(r, k) = a[r·a_rs + k·a_ks], B rows with
// stride ldb; NV vectors of 16 columns, the last one under `last` on an N edge (Edge), else whole.
// The block's first row and column in C (row0, col0) are the epilogue's (epi).
template <int MR, int NV, bool Edge, class Elem, class Epi, class Ld>
inline void ukernel(int K, const Elem* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const Elem* b,
                    std::ptrdiff_t ldb, float* c, Ld ldc, bool accumulate, __mmask16 last,
                    const Epi& epi, int row0, int col0) {
    static_assert(MR >= 1 && MR <= 6 && NV >= 1 && NV <= 4);
    using Ops = UkernelOps<Elem>;
    using AVec = typename Ops::AVec;
    using BVec = typename Ops::BVec;
    constexpr __mmask16 kAll = 0xFFFF;
    const __mmask16 edge = Edge ? last : kAll;  // a constant off the edge: C's loads and stores whole
    const __mmask16 m0 = NV == 1 ? edge : kAll, m1 = NV == 2 ? edge : kAll, m2 = NV == 3 ? edge : kAll, m3 = edge;
    // The last vector of B under its mask only on an N edge (Edge): every 64-column panel loaded
    // its last vector masked (hot in L1, K = 64: whole loads 1–3 % faster, kernels-lab.md#bwd-7).
    const auto load_last = [&](__mmask16 m, const Elem* p) {
        if constexpr (Edge) return Ops::load(m, p);
        else return Ops::load(p);
    };
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m512 c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
    __m512 c40 = c00, c41 = c00, c42 = c00, c43 = c00, c50 = c00, c51 = c00, c52 = c00, c53 = c00;
#define ATTN_ROWS(X)                                                                               \
    X(0, c00, c01, c02, c03) X(1, c10, c11, c12, c13) X(2, c20, c21, c22, c23) X(3, c30, c31, c32, c33) \
    X(4, c40, c41, c42, c43) X(5, c50, c51, c52, c53)
#define ATTN_LOAD(r, x0, x1, x2, x3)                                                 \
    if constexpr (MR > r) {                                                          \
        x0 = _mm512_maskz_loadu_ps(m0, c + r * ldc);                                 \
        if constexpr (NV >= 2) x1 = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16);     \
        if constexpr (NV >= 3) x2 = _mm512_maskz_loadu_ps(m2, c + r * ldc + 32);     \
        if constexpr (NV >= 4) x3 = _mm512_maskz_loadu_ps(m3, c + r * ldc + 48);     \
    }
    if (accumulate) { ATTN_ROWS(ATTN_LOAD) }
#define ATTN_MADD(r, x0, x1, x2, x3)                                                            \
    if constexpr (MR > r) {                                                                     \
        const AVec av = Ops::broadcast(Ops::kIndexFirst ? &a[r * a_rs + o] : a + r * a_rs + o); \
        x0 = Ops::madd(x0, av, b0);                                                             \
        if constexpr (NV >= 2) x1 = Ops::madd(x1, av, b1);                                      \
        if constexpr (NV >= 3) x2 = Ops::madd(x2, av, b2);                                      \
        if constexpr (NV >= 4) x3 = Ops::madd(x3, av, b3);                                      \
    }
    std::ptrdiff_t o = 0;
    for (int k = 0; k < K; ++k, o += a_ks, b += ldb) {
        // the last vector of B under its mask on an edge, the others whole (unused ones: b0 again, dead)
        const BVec b0 = NV == 1 ? load_last(m0, b) : Ops::load(b);
        const BVec b1 = NV == 2 ? load_last(m1, b + 16) : NV > 2 ? Ops::load(b + 16) : b0;
        const BVec b2 = NV == 3 ? load_last(m2, b + 32) : NV > 3 ? Ops::load(b + 32) : b0;
        const BVec b3 = NV == 4 ? load_last(m3, b + 48) : b0;
        ATTN_ROWS(ATTN_MADD)
    }
#define ATTN_STORE(r, x0, x1, x2, x3)                                                                  \
    if constexpr (MR > r) {                                                                            \
        _mm512_mask_storeu_ps(c + r * ldc, m0, epi(row0 + r, col0, m0, x0));                           \
        if constexpr (NV >= 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, epi(row0 + r, col0 + 16, m1, x1)); \
        if constexpr (NV >= 3) _mm512_mask_storeu_ps(c + r * ldc + 32, m2, epi(row0 + r, col0 + 32, m2, x2)); \
        if constexpr (NV >= 4) _mm512_mask_storeu_ps(c + r * ldc + 48, m3, epi(row0 + r, col0 + 48, m3, x3)); \
    }
    ATTN_ROWS(ATTN_STORE)
#undef ATTN_ROWS
#undef ATTN_LOAD
#undef ATTN_MADD
#undef ATTN_STORE
}

template <int NV, bool Edge, class Elem, class Epi, class Ld>
inline void ukernel_rows(int mr, int K, const Elem* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const Elem* b,
                         std::ptrdiff_t ldb, float* c, Ld ldc, bool acc, __mmask16 last, const Epi& epi,
                         int row0, int col0) {
    switch (mr) {
        case 6: ukernel<6, NV, Edge>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0); break;
        case 5: ukernel<5, NV, Edge>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0); break;
        case 4: ukernel<4, NV, Edge>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0); break;
        case 3: ukernel<3, NV, Edge>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0); break;
        case 2: ukernel<2, NV, Edge>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0); break;
        default: ukernel<1, NV, Edge>(K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0); break;
    }
}

// The panel's row blocks on NV vectors; the last under its mask only when it is partial.
template <int NV, class Elem, class Epi>
inline void ukernel_panel(int mr, int K, const Elem* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const Elem* b,
                          std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool acc, __mmask16 last, const Epi& epi,
                          int row0, int col0) {
    if (last == 0xFFFF) {
        if constexpr (NV == 4) {  // whole 64-column panels: C's common strides fixed (FixedStride)
            if (ldc == 64) return ukernel_rows<4, false>(mr, K, a, a_rs, a_ks, b, ldb, c, FixedStride<64>{}, acc, last, epi, row0, col0);
            if (ldc == 128) return ukernel_rows<4, false>(mr, K, a, a_rs, a_ks, b, ldb, c, FixedStride<128>{}, acc, last, epi, row0, col0);
        }
        ukernel_rows<NV, false>(mr, K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0);
    } else ukernel_rows<NV, true>(mr, K, a, a_rs, a_ks, b, ldb, c, ldc, acc, last, epi, row0, col0);
}

// C(M×N) (+)= A(M×K)·B(K×N), N % 8 == 0. Column panels of 64 outermost so a K×64 panel of B
// stays in L1 while the row blocks stream past it; the last panel (8 to 56 columns) runs on
// 1–4 vectors, the last under a mask. ahead: lines to request, a few per row block (tile.hpp,
// RowsAhead), or null. epi: what each vector of C becomes as it is stored (StoreAsIs).
template <class Elem, class Epi = StoreAsIs>
void gemm(int M, int N, int K, const Elem* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const Elem* b,
          std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate, RowsAhead* ahead = nullptr,
          const Epi& epi = {}) {
    for (int n0 = 0; n0 < N; n0 += 64) {
        const int w = N - n0 < 64 ? N - n0 : 64, nv = (w + 15) / 16;
        const __mmask16 last = lanes(w - 16 * (nv - 1));
        for (int m0 = 0; m0 < M; m0 += 6) {
            const int mr = M - m0 < 6 ? M - m0 : 6;
            const Elem* am = a + m0 * a_rs;
            float* cm = c + m0 * ldc + n0;
            // The next row block's C requested while this block's k loop runs: dK, dV and dQ rows are
            // mostly in the L2 (in place +1 %; hot in L1 it costs 3–5 %: kernels-lab.md#bwd-7).
            if (accumulate && m0 + 6 < M)
                for (int r = 0; r < 6 && m0 + 6 + r < M; ++r)
                    for (int v = 0; v < nv; ++v) _mm_prefetch(reinterpret_cast<const char*>(cm + (6 + r) * ldc + 16 * v), _MM_HINT_T0);
            if (ahead) ahead->request();
            switch (nv) {
                case 4: ukernel_panel<4>(mr, K, am, a_rs, a_ks, b + n0, ldb, cm, ldc, accumulate, last, epi, m0, n0); break;
                case 3: ukernel_panel<3>(mr, K, am, a_rs, a_ks, b + n0, ldb, cm, ldc, accumulate, last, epi, m0, n0); break;
                case 2: ukernel_panel<2>(mr, K, am, a_rs, a_ks, b + n0, ldb, cm, ldc, accumulate, last, epi, m0, n0); break;
                default: ukernel_panel<1>(mr, K, am, a_rs, a_ks, b + n0, ldb, cm, ldc, accumulate, last, epi, m0, n0); break;
            }
        }
    }
}
