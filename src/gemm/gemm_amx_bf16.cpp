// The avx512 row's GEMM for bfloat16 A and B on a CPU with AMX-BF16: the micro-kernel keeps a
// 32 × 32 block of C in four tiles over the whole K chunk and adds tdpbf16ps products into it
// (C[16 × 16 float32] += A[16 rows × 32 bf16] · B[16 pair rows × 16 pair words]: 16·16·32
// products per instruction, against vdpbf16ps's 32). gemm_driver.hpp does the rest: op(B) is
// packed as the pair kernel's pair words (gemm_avx512_bf16.cpp: the same KC, NR and layout,
// so a PackedB's pair panels serve both), op(A) as tile rows (pack_a_rows). sgemm (gemm.cpp)
// calls it only for all-bf16 operands when cpu_features().has_amx_bf16(); compiled with
// ATTN_AMX_BF16_FLAGS (src/CMakeLists.txt), its tiles configured by kernels/simd/amx_tiles.hpp.
//
// Arithmetic: as the pair kernel's — each element one chain of rounded float32 additions of
// exact bf16 products over k in K-chunk order, two per pair (SDM, TDPBF16PS: each accumulation
// rounds to nearest even; bf16 inputs below 2^-126 read as 0, denormal sums flush to 0; MXCSR
// is not consulted), so gemm.hpp's bound holds. The order differs from the pair kernel's
// (tdpbf16ps sums a step's 16 pairs into the tile element in its own order), so the two
// kernels' bits differ; each is deterministic, and an element's chain depends on K alone.
//
// Where the time goes (per 32 × 32 block and step of 32 k): 2 A + 2 B tile loads (4 KiB) for
// 4 tdpbf16ps (65536 FLOP); the epilogue (4 tile stores to a scratch and the AVX-512 store
// rules of gemm_store_avx512.hpp) once per block and K chunk.
#include <immintrin.h>

#include "../kernels/isa.hpp"
#include "../kernels/simd/amx_tiles.hpp"
#define ATTN_GEMM_NS gemm_amx_bf16_ns
#include "gemm_driver.hpp"
#include "gemm_store_avx512.hpp"

namespace attn::detail {
namespace gemm_amx_bf16_ns {
namespace {

// Tiles: C (row tile h, column tile v) in tmm(2h + v), A's row tiles in tmm4, tmm5, B's two
// 16-column tiles in tmm6, tmm7. MR = 32 (two A tiles) or a few-row variant R <= 16 (one).
template <int MR>
struct AmxMicro {
    static constexpr std::int64_t kMR = MR, kNR = 32, kKC = 1024, kMC = 256, kNC = 4096;
    static constexpr bool kPairs = true;     // op(B): pair words, the pair kernel's panels
    static constexpr bool kAmxPanels = true;  // op(A): tile rows (pack_a_rows)
    using ThreadScope = AmxTiles;            // each thread configures its own tiles
    template <int R>
    using WithRows = AmxMicro<R>;
    static_assert(MR == 32 || (MR >= 1 && MR <= 16), "two row tiles, or one for a few-row variant");
    static constexpr int kRowTiles = MR > 16 ? 2 : 1;
    static constexpr std::int64_t kStepBytesA = kRowTiles * kAmxRows * kAmxRowBytes;  // one step of the A panel
    static constexpr std::int64_t kStepBytesB = kAmxRows * kNR * 4;                     // 16 pair rows × NR words

    static void tile(std::int64_t kc, const float* a_panel, const float* b_panel, float* c, std::int64_t ldc, float beta,
                     const float* bias) {
        const auto* a = reinterpret_cast<const char*>(a_panel);
        const auto* b = reinterpret_cast<const char*>(b_panel);
        prefetch_c<MR, 2>(c, ldc);
        _tile_zero(0);
        _tile_zero(1);
        if constexpr (kRowTiles == 2) {
            _tile_zero(2);
            _tile_zero(3);
        }
        const std::int64_t np = (kc + 1) / 2, full = np / kAmxRows;  // pair rows of B; whole 16-row steps
        for (std::int64_t s = 0; s < full; ++s) {
            if (s + kAhead < full) prefetch_step(a + (s + kAhead) * kStepBytesA, b + (s + kAhead) * kStepBytesB);
            step(a + s * kStepBytesA, b + s * kStepBytesB, kNR * 4);
        }
        if (full * kAmxRows < np) {
            // The last step's B rows past the sliver's end would be another sliver's words (or
            // past the buffer): copy the rest to a zero-padded tile pair. (A is zero there.)
            alignas(64) std::uint32_t last[kAmxRows * kNR] = {};
            std::memcpy(last, b + full * kStepBytesB, static_cast<std::size_t>((np - full * kAmxRows) * kNR * 4));
            step(a + full * kStepBytesA, reinterpret_cast<const char*>(last), kNR * 4);
        }
        store<0>(c, ldc, beta, bias);
        if constexpr (kRowTiles == 2) store<1>(c + 16 * ldc, ldc, beta, bias);
    }

private:
    // The A panel and B sliver (48 KiB each at S6's kc = 768) come from L2, and S6's QKV weight
    // (3.5 MB of pair panels) from L3 once per MC block: tileloadd waits on each miss. Fetching
    // the step kAhead ahead into L1 took S6's QKV GEMM 463–500 → 608–659 GFLOP/s per core (out
    // and square GEMMs, whose B fits L2: level); 2 ahead gained less, MC = 512 nothing.
    static constexpr std::int64_t kAhead = 4;  // steps
    static void prefetch_step(const char* a, const char* b) {
        for (std::int64_t x = 0; x < kStepBytesA; x += 64) _mm_prefetch(a + x, _MM_HINT_T0);
        for (std::int64_t x = 0; x < kStepBytesB; x += 64) _mm_prefetch(b + x, _MM_HINT_T0);
    }

    // One step of 32 k: A's row tiles (64-byte rows, contiguous) times B's two column tiles.
    static void step(const char* a, const char* b, std::int64_t b_stride) {
        ATTN_TILE_LOAD(6, b, b_stride);
        ATTN_TILE_LOAD(7, b + 64, b_stride);
        ATTN_TILE_LOAD(4, a, kAmxRowBytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if constexpr (kRowTiles == 2) {
            ATTN_TILE_LOAD(5, a + kAmxRows * kAmxRowBytes, kAmxRowBytes);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }

    // C's row tile H (tmm 2H, 2H + 1) to 16 rows of 32 floats at dst, rows `stride` bytes apart.
    // (GCC's tile intrinsics paste the tile number into the instruction's text: literals only.)
    template <int H>
    static void store_row_tile(float* dst, std::int64_t stride) {
        if constexpr (H == 0) {
            _tile_stored(0, dst, stride);
            _tile_stored(1, dst + 16, stride);
        } else {
            _tile_stored(2, dst, stride);
            _tile_stored(3, dst + 16, stride);
        }
    }

    // Row tile H of C (rows 16H..) through a scratch into c with the AVX-512 store rules
    // (beta, bias); a whole tile with beta = 0 and no bias is stored straight into C.
    template <int H>
    static void store(float* c, std::int64_t ldc, float beta, const float* bias) {
        constexpr int rows = MR > 16 ? 16 : MR;
        if constexpr (rows == 16) {
            if (beta == 0.0f && bias == nullptr) {
                store_row_tile<H>(c, ldc * 4);
                return;
            }
        }
        alignas(64) float t[kAmxRows * kNR];
        store_row_tile<H>(t, kNR * 4);
        __m512 acc[rows][2];
        for (int r = 0; r < rows; ++r)
            for (int v = 0; v < 2; ++v) acc[r][v] = _mm512_load_ps(t + r * kNR + 16 * v);
        store_tile<rows, 2>(acc, c, ldc, beta, bias);
    }
};

}  // namespace
}  // namespace gemm_amx_bf16_ns

void gemm_amx_bf16(const GemmArgs& g) { gemm_amx_bf16_ns::gemm_driver<gemm_amx_bf16_ns::AmxMicro<32>>(g); }

}  // namespace attn::detail
