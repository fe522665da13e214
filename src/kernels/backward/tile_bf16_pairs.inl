// The vector side of the backward tiles with bf16 products, shared by the vdpbf16ps tile
// (tile_avx512_bf16.cpp) and the AMX tile (tile_amx_bf16.cpp, whose edges run here): the
// UkernelOps of tile_avx512_gemm.inl for pair words, and dS rounded to bf16 rows for dQ += dS·K.
// Included inside the tile file's anonymous namespace, after tile_avx512_gemm.inl; needs
// <immintrin.h>, <cstring> and <cstdint>.

inline __m512bh pairs(__m512i x) { return (__m512bh)x; }

// A and B of pair words (two bf16 along the reduction dimension in one uint32): one vdpbf16ps
// (two products per lane) per accumulator and pair step, so gemm's K counts pairs.
template <>
struct UkernelOps<std::uint32_t> {
    using AVec = __m512bh;
    using BVec = __m512bh;
    static __m512bh load(const std::uint32_t* b) { return pairs(_mm512_loadu_si512(b)); }
    static __m512bh load(__mmask16 m, const std::uint32_t* b) { return pairs(_mm512_maskz_loadu_epi32(m, b)); }
    static constexpr bool kIndexFirst = false;
    // memcpy because A may be a bf16 (uint16) array read as words (Q/dO/dS rows), which a
    // uint32 load would read through the wrong type.
    static __m512bh broadcast(const std::uint32_t* a) {
        int w;
        std::memcpy(&w, a, sizeof w);
        return pairs(_mm512_set1_epi32(w));
    }
    static __m512 madd(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
};

// A bf16 row (2-byte elements, even stride) read as pair words.
inline const std::uint32_t* words(const std::uint16_t* p) { return reinterpret_cast<const std::uint32_t*>(p); }

// dS (br × bcp float32, row stride bcp) rounded to bf16 rows (row stride bcp), the A of
// dQ += dS·K; vcvtneps2bf16 rounds to nearest even.
inline void ds_bf16_rows(const float* ds, int br, int bcp, std::uint16_t* dst) {
    for (int i = 0; i < br; ++i) {
        const float* src = ds + static_cast<std::ptrdiff_t>(i) * bcp;
        std::uint16_t* row = dst + static_cast<std::ptrdiff_t>(i) * bcp;
        for (int j = 0; j < bcp; j += 16) {  // bcp % 8 == 0: the last step may be 8 lanes
            const __mmask16 m = lanes(bcp - j);
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + j));
            _mm256_mask_storeu_epi16(row + j, m, (__m256i)h);
        }
    }
}
