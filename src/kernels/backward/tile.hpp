// The compute of one (query block × key block) tile of the tiled backward, for one ISA.
// The driver (flash_backward.cpp, portable code) packs operands and dropout factors and
// calls the kernel table's backward_tile; only the tile differs per ISA, so it is the only
// backward code compiled with ISA flags. The score rule (scores.hpp) reaches the tile as a
// callback into the driver's portable code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn::detail {

// The operands of the bf16 products (tile_avx512_bf16.cpp; query_heads.hpp, key_blocks.hpp pack them
// when bf16 compute runs, docs/conventions.md "bf16 compute"). A pair word holds two bf16
// adjacent along the product's reduction dimension, the first in its low half (what
// vdpbf16ps multiplies lane by lane); an odd length ends with a zero element.
struct TileBf16 {
    const std::uint16_t* q = nullptr;   // (br, Dkp) bf16 Q rows, row stride ldq (even): pairs along d
    std::ptrdiff_t ldq = 0;
    const std::uint16_t* dO = nullptr;  // (br, Dvp) bf16 dO rows, row stride ldo (even)
    std::ptrdiff_t ldo = 0;
    const std::uint32_t* q_pairs = nullptr;   // (⌈br/2⌉, Dkp) words (Q[2r][d], Q[2r+1][d]), from q_dk
    const std::uint32_t* dO_pairs = nullptr;  // (⌈br/2⌉, Dvp) words, from dO_dv
    const std::uint32_t* kt_pairs = nullptr;  // (⌈Dk/2⌉, bcp) words (K[j][2p], K[j][2p+1])
    const std::uint32_t* vt_pairs = nullptr;  // (⌈Dv/2⌉, bcp) words
    const std::uint32_t* k_pairs = nullptr;   // (⌈bc/2⌉, Dkp) words (K[2p][d], K[2p+1][d]), from kp
    std::uint32_t* p_pairs = nullptr;   // scratch (⌈br/2⌉, bcp): P̂, then dS, as pairs along rows
    // scratch (br, bcp): dS rows in bf16; the AMX tile (tile_amx_bf16.cpp) first puts P̂ᵀ and dSᵀ
    // there as bc rows of 32 pair words (64 × 64 bf16 either way)
    std::uint16_t* ds_rows = nullptr;
};

// Sizes in elements; "padded" widths are multiples of 8 with zero padding, so the
// GEMMs never need column edges. All float32.
// log2 e for the tile's exp_row hook: P = 2^((s·scale − lse)·kTileLog2e), lse subtracted
// first, in natural units. Scaling s and lse by log2 e apart (an exact fma product less a
// rounded −lse·log2 e) differs by about |lse|·2^-24 in the exponent: 2^(±10^22) — P = inf,
// NaN gradients — for a row whose every key carries a finite bias of −10^30.
inline constexpr float kTileLog2e = 1.4426950408889634f;
// The tile's P is clamped to 1, which it cannot exceed exactly: the scores it recomputes round
// differently from the forward's (lse's), an error of order scale·Dk·2^-24 in the exponent that
// put P far above 1 with unit-scale Q and K — dV 5·10^26 at scale 10^8, inf and NaN gradients
// above (docs/conventions.md, "Shapes of attn::sdpa"). One min per vector of P; a NaN P stays NaN.

// Lines requested into the L2 (`prefetcht1`) ahead of their first read, a few per row block of
// the S and dP products (the avx512 float32 tile's gemm) while a query tile's pass runs — spread,
// because a burst of ≈ 100 requests before a product stalled the tile itself (S1 −1.7 %,
// kernels-lab.md#bwd-9; the forward's fwd-28 likewise). Owned by the driver, one per query tile
// (next_rows, row_requests.hpp); the tile's products advance it, and it changes no value.
// What it holds, range after range:
// - the next query tile's Q and dO rows, where a pass streams more rows than the L2 holds (S3's
//   6 MiB a head, against 2 MiB of L2): the first key block of each pass read them from the L3
//   inside S and dP, 9–10 % more time per FLOP there than in dV, dK and dQ (3–5 % where the rows
//   fit); requested, −2 to −4 %, S3 ≈ +3 % (kernels-lab.md#bwd-9);
// - a slice of the next pass's K and V rows, the first read of which was the transposes'
//   (pack_key_block): spread over the pass's last query tiles; in a task's last pass instead a
//   slice of the rows the thread's next task reads first — its Q, dO and O rows (the non-finite
//   scans, D) and its first K and V rows — where they fit the L2 beside the current task's
//   (row_requests.hpp, SlicedRows; kernels-lab.md#bwd-10).
// S and dP request them fused or not (a score rule, softcap or dropout run them unfused).
struct RowsAhead {
    static constexpr int kRanges = 6;
    struct Range {
        const char* base = nullptr;  // first row
        std::ptrdiff_t ld = 0;       // row stride, bytes
        int rows = 0, row_bytes = 0;
        int lines() const { return rows * ((row_bytes + 63) / 64); }
    };
    Range range[kRanges];
    int ranges = 0;
    int per_block = 0;  // lines requested per row block
    int r = 0, row = 0, off = 0;  // the next line to request
    void add(const void* base, std::ptrdiff_t ld, int rows, int row_bytes) {
        if (rows > 0 && row_bytes > 0 && ranges < kRanges) range[ranges++] = {static_cast<const char*>(base), ld, rows, row_bytes};
    }
    int lines() const {
        int n = 0;
        for (int i = 0; i < ranges; ++i) n += range[i].lines();
        return n;
    }
    // The next per_block lines (fewer at the end), each into the L2.
    void request() {
        for (int n = 0; n < per_block && r < ranges;) {
            const Range& g = range[r];
            if (row < g.rows) {
                __builtin_prefetch(g.base + row * g.ld + off, 0, 2);
                ++n;
                if ((off += 64) >= g.row_bytes) off = 0, ++row;
            } else {
                ++r, row = 0;
            }
        }
    }
};

struct TileArgs {
    int br = 0;   // query rows in the tile
    int bc = 0;   // keys in the tile
    int bcp = 0;  // bc rounded up to 8: the row stride of S, dP, Pd, bias, drop, kt, vt
    int Dk = 0, Dv = 0, Dkp = 0, Dvp = 0;
    const float* q = nullptr;   // (br, Dkp) row stride ldq: Q rows of the block
    std::ptrdiff_t ldq = 0;
    const float* dO = nullptr;  // (br, Dvp) row stride ldo: dO rows of the block
    std::ptrdiff_t ldo = 0;
    // The operands of dK += dSᵀ·Q and dV += P̂ᵀ·dO: q and dO, or copies with their NaN/±inf
    // entries 0 (flash_backward.cpp says why). With dO_nonfinite the tile adds each such
    // dO entry back as P̂·dO where P̂ is not 0.
    const float* q_dk = nullptr;
    std::ptrdiff_t ldq_dk = 0;
    const float* dO_dv = nullptr;
    std::ptrdiff_t ldo_dv = 0;
    bool dO_nonfinite = false;
    const float* kt = nullptr;  // (Dk, bcp): Kᵀ of the key block
    const float* vt = nullptr;  // (Dv, bcp): Vᵀ of the key block
    const float* kp = nullptr;  // (bc, Dkp): K of the key block
    const float* neg_lse = nullptr;   // (br): −lseᵢ; −inf for a row with no visible key
    const float* Drow = nullptr;      // (br): Dᵢ = rowsum(dO ∘ O)
    const float* drop = nullptr;  // (br, bcp) or null: dropout factor, 0 or 1/(1−p)
    float scale = 1.0f;
    // The part of the scale dS carries, dS = ds_scale·P∘(dP − D); the driver multiplies the
    // stored dQ and dK by the rest (backward_plan.hpp, split_scale).
    float ds_scale = 1.0f;
    // Null when every key of the tile is visible to every row and no element-wise rule
    // applies: P = 2^((S·scale − lse)·log2 e). Otherwise called on each row of
    // S = Q·Kᵀ (bcp entries): it leaves the scaled scores after the score rule, in natural
    // units, with −inf for masked and padded keys.
    void (*score_rule)(const void* ctx, int row, float* s) = nullptr;
    const void* rule_ctx = nullptr;
    // Softcap c > 0 (0 = off): the tile itself scales and caps each row of S (vectorised with
    // its ISA) before score_rule, which then applies only ALiBi and the masks; softcap_grad
    // (br, bcp) keeps 1 − tanh²(s/c), zeroed by score_rule where masked, and dS is
    // multiplied by it (the chain rule through c·tanh(s/c)).
    float softcap = 0.0f, softcap_inv = 0.0f;  // c and float(1/c), as the forward rounds them
    float* softcap_grad = nullptr;
    float* S = nullptr;   // scratch (br, bcp): S, then P
    float* dP = nullptr;  // scratch (br, bcp): dP, then dS
    float* Pd = nullptr;  // scratch (br, bcp): P ∘ drop (used only with dropout)
    float* dq = nullptr;  // (br, Dkp) row stride lddq: dQ accumulator rows of the block
    std::ptrdiff_t lddq = 0;
    float* dk = nullptr;  // (bc, Dkp): dK accumulator of the key block
    float* dv = nullptr;  // (bc, Dvp): dV accumulator of the key block
    // The accumulators hold no sum yet (the first tile to reach them): dK += dSᵀ·Q and
    // dV += P̂ᵀ·dO (dkv_first), dQ += dS·K (dq_first) store their product instead of adding it,
    // so the driver need not zero them first. The same bits: a sum started from C = +0 is the
    // product itself (fma(a, b, +0) = a·b rounded, and −0 + +0 = +0 as from zeroed memory).
    bool dkv_first = false, dq_first = false;
    RowsAhead* ahead = nullptr;  // or null: nothing to request
    const TileBf16* bf16 = nullptr;  // the bf16 operands; only KernelSet::backward_tile_bf16 reads them
};

}  // namespace attn::detail
