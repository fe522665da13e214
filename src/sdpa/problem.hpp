// SdpaProblem — the one params struct every kernel receives: validated views (masks
// already broadcast to (B, Hq, Lq, Lk) with stride-0 dims), resolved scale, sizes, and
// the mask rules written once (docs/conventions.md has the pictures).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "../core/check.hpp"
#include "../core/dropout.hpp"
#include "attn/sdpa.hpp"
#include "option_values.hpp"  // check_option_values: make_problem's first option check

namespace attn::detail {

struct PagedRows;  // kernels/paged_rows.hpp

// Whether a call with these dtypes asks for bfloat16 all through (SdpaProblem::bf16_products):
// make_problem's rule, and ring attention's for its blocks, whose float32 outputs are its own.
// out must be bf16 too because bf16 compute rounds an intermediate (P; dS in the backward) to
// bf16, an error of out's own rounding only when out is bf16. The projection GEMM's bf16 pairs
// (bf16_pairs_run, src/gemm/gemm.cpp) round nothing — its operands are the caller's bf16
// values, each product exact in float32 — so they need no such output and have a rule of their own.
inline bool asks_bf16_products(DType q, DType k, DType v, DType out) {
    return q == DType::bf16 && k == DType::bf16 && v == DType::bf16 && out == DType::bf16;
}

// Half-open interval of key indices [lo, hi) that the structural masks (causal,
// window, key lengths) leave visible to one query. Every structural mask is an
// interval, so their intersection is one too; kernels use it to skip whole tiles.
struct KeyRange {
    std::int64_t lo = 0;
    std::int64_t hi = 0;
    bool empty() const { return hi <= lo; }
};

struct SdpaProblem {
    std::string_view op = "sdpa";  // the public function that built it (make_problem's kOp, a literal): errors' prefix
    TensorView q, k, v, out;
    std::optional<TensorView> lse, weights;
    std::optional<TensorView> scores;  // (B, Hq, Lq, Lk) at scores_stage (attn::ScoresOutput)
    ScoreStage scores_stage = ScoreStage::masked;
    std::optional<TensorView> bool_mask;      // broadcast to (B, Hq, Lq, Lk)
    std::optional<TensorView> additive_mask;  // broadcast to (B, Hq, Lq, Lk); float32 or float64
    // A float16/bfloat16 additive mask widened to float32 by make_problem (exact), which
    // additive_mask then views: the kernels read one float dtype however the mask came.
    std::shared_ptr<const Tensor> additive_mask_f32;
    std::optional<TensorView> key_lengths;    // (B,) int32/int64
    std::int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, Dk = 0, Dv = 0;
    std::int64_t group = 1;  // Hq / Hkv: query heads per KV head
    double scale = 1.0;
    Causal causal = Causal::none;
    Window window{};
    // SdpaOptions::query_offset, when given: replaces both alignments (see diagonal_offset).
    bool has_query_offset = false;
    // The caller asked for bfloat16 all through (Q, K, V and out: asks_bf16_products): the flash
    // forward may then run its products on bf16 pairs where the CPU has them ("bf16 compute",
    // docs/conventions.md), which rounds P to bf16 — an error of the order of out's own rounding.
    // A float32 out keeps the float32 products and their bound. (Tests set it by hand to measure
    // P's rounding alone.)
    bool bf16_products = false;
    std::int64_t query_offset_value = 0;
    std::optional<TensorView> query_offsets;  // (B,) int32/int64
    // A block of the caller's query rows (paged_attention with impl = decode runs chunked
    // prefill as decode blocks of 16): row i here is row rows_before + i of the caller's problem, which
    // has rows_after more rows below. The diagonals (masks, ALiBi) and the dropout rows stay
    // the caller's; q, out, lse and the masks are the block's slices.
    std::int64_t rows_before = 0, rows_after = 0;
    double dropout_p = 0.0;         // 0 ≤ p < 1; 0 = no dropout (src/core/dropout.hpp)
    std::uint64_t dropout_seed = 0;
    DropoutOrigin dropout_origin{};  // SdpaOptions::dropout_origin (checked)
    // Score modifiers (scores.hpp applies them): softcap c (0 = off), ALiBi slopes broadcast
    // to (B, Hq) float32, sinks (Hq,) float32.
    double softcap = 0.0;
    std::optional<TensorView> alibi_slopes;
    std::optional<TensorView> sinks;
    // Set only by paged_attention for the flash kernel (chunked prefill): K/V rows live in
    // the pages of a PagedKVCache (kernels/paged_rows.hpp), not at k/v.offset(b, h, j, d).
    const PagedRows* paged = nullptr;

    // GQA head map: query head h reads KV head h / group (consecutive query heads share).
    std::int64_t kv_head(std::int64_t h) const { return h / group; }

    // n_b: keys 0..n_b−1 of sequence b exist (key_lengths[b], else Lk).
    std::int64_t key_length(std::int64_t b) const {
        if (!key_lengths) return Lk;
        return int_at(*key_lengths, b);
    }

    // The one alignment rule (docs/conventions.md): query i of sequence b has its diagonal
    // at d_b(i) = i + diagonal_offset(a, b), the position of query 0 among the keys —
    //   query_offset given: offset_b, whatever the alignment;
    //   top-left: 0;   bottom-right: n_b − Lq (per sequence, from key_lengths);
    // in a block of rows (rows_before), query i is the caller's query rows_before + i.
    std::int64_t diagonal_offset(Align a, std::int64_t b) const {
        if (has_query_offset) return (query_offsets ? int_at(*query_offsets, b) : query_offset_value) + rows_before;
        return a == Align::top_left ? rows_before : key_length(b) - Lq - rows_after;
    }

    // Visible keys of query i of sequence b: [0, n_b) ∩ causal ∩ window. Always inlined: clang
    // -O3 kept it out of line in the flash ISA files, a weak copy compiled with their flags that
    // generic code could be linked to (tests/kernels/check_isa_symbols.sh).
    __attribute__((always_inline)) KeyRange key_range(std::int64_t b, std::int64_t i) const {
        KeyRange r{0, std::min(Lk, key_length(b))};
        if (causal != Causal::none) {
            const Align a = causal == Causal::top_left ? Align::top_left : Align::bottom_right;
            r.hi = std::min(r.hi, i + diagonal_offset(a, b) + 1);
        }
        if (window.active()) {
            const std::int64_t d = i + diagonal_offset(window.align, b);
            if (window.left >= 0) r.lo = std::max(r.lo, d - window.left);
            if (window.right >= 0) r.hi = std::min(r.hi, d + window.right + 1);
        }
        return r;
    }

    // The keep rule of this call (inactive when dropout_p = 0), with its origin: every kernel's.
    Dropout dropout() const {
        return Dropout(dropout_p, dropout_seed, dropout_origin.batch, dropout_origin.head,
                       dropout_origin.row + rows_before, dropout_origin.key);
    }

    bool has_elementwise_mask() const { return bool_mask.has_value() || additive_mask.has_value(); }
    // Softcap or ALiBi: they change every visible score.
    bool has_score_modifiers() const { return softcap > 0.0 || alibi_slopes.has_value(); }

    // m_h of sequence b (0 without ALiBi).
    float alibi_slope(std::int64_t b, std::int64_t h) const {
        return alibi_slopes ? alibi_slopes->data_as<const float>()[alibi_slopes->offset(b, h)] : 0.0f;
    }
    // σ_h; −inf without sinks (a sink of logit −inf takes no mass).
    float sink(std::int64_t h) const {
        return sinks ? sinks->data_as<const float>()[sinks->offset(h)] : -std::numeric_limits<float>::infinity();
    }
    // ALiBi measures |d_b(i) − j| from the bottom-right diagonal (query_offset when given).
    std::int64_t alibi_offset(std::int64_t b) const { return diagonal_offset(Align::bottom_right, b); }

private:
    static std::int64_t int_at(const TensorView& t, std::int64_t b) {
        const std::int64_t o = t.offset(b);
        return t.dtype() == DType::i32 ? t.data_as<const std::int32_t>()[o] : t.data_as<const std::int64_t>()[o];
    }
};

// Per-sequence query offsets: (n,) int32/int64, every entry within ±2^60 (the message names the
// entry; `count` names n: "B", or "N" packed sequences). make_problem's check, and the packed
// entry points' for all N sequences up front.
TensorView require_query_offsets(std::string_view kOp, const TensorView& offsets, std::int64_t n,
                                 std::string_view count = "B");

// A float32 vector or matrix of per-head values (alibi_slopes, sinks), every one finite.
void require_finite_f32(std::string_view kOp, const TensorView& t, const char* name);

// Whether a size-0 dim of Q, K or V is refused (every call that computes: "Q: length must be
// >= 1 but got 0") or allowed (a call that is only checked: attn.torch answers an empty call
// itself, after the very checks a call with data gets — python/sdpa.cpp's _check_sdpa).
enum class SizeZero { refused, allowed };

// Checks Q, K and V alone (rank, float dtype, dims >= 1 unless `zero` allows 0, how they agree)
// and fills the sizes of p (B, Hq, Hkv, Lq, Lk, Dk, Dv, group): make_problem's first step, and
// sdpa_output_shapes'.
void check_qkv(const TensorView& q, const TensorView& k, const TensorView& v, SdpaProblem& p, std::string_view op,
               SizeZero zero = SizeZero::refused);

// Checks every argument (throws attn::Error naming it, prefixed by `op`: the public entry
// point that was called) and builds the problem. Every entry point builds its problem here;
// a backward, which reads out and lse, says so (OutLse::read: no output rule for them).
SdpaProblem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                         const SdpaOptions& options, const TensorView& out, const TensorView* lse,
                         const TensorView* weights, std::string_view op = "sdpa", OutLse out_lse = OutLse::written,
                         SizeZero zero = SizeZero::refused);

// Every check an sdpa call makes before it computes — make_problem's and, for a requested
// kernel, that it can run the call (require_requested_kernel_runs) — and nothing computed: for
// a caller that must refuse a call before work of its own (python/sdpa.cpp's _check_sdpa for
// attn.torch's empty calls; the MHA layer before its projections). q, k and v are never read:
// they may be stand-ins with the call's shapes, dtypes and strides.
void check_call(const TensorView& q, const TensorView& k, const TensorView& v, const SdpaOptions& options,
                const TensorView& out, const TensorView* weights, std::string_view op = "sdpa",
                SizeZero zero = SizeZero::refused);

// A forward's outputs (out, lse, weights, scores) share no memory with its inputs (Q, K, V and
// the option tensors: masks, key lengths, query offsets, ALiBi slopes, sinks) or with each
// other: a kernel writes them while it still reads the others. Every forward entry point calls
// it (not make_problem: the backward reads out and lse).
void require_outputs_apart(const SdpaProblem& p, const SdpaOptions& options, std::string_view op = "sdpa");
// The same for calls on packed sequences (sdpa_varlen: cu_seqlens are inputs too).
void require_outputs_apart(std::string_view op, std::vector<Named> inputs, const SdpaOptions& options,
                           const std::vector<Named>& outputs);

// `inputs` and the option tensors a kernel reads (masks, key lengths, per-sequence query
// offsets, ALiBi slopes, sinks; null where not given): the inputs for require_apart.
std::vector<Named> with_option_tensors(std::vector<Named> inputs, const SdpaOptions& options);

// A backward's gradient arguments, as sdpa_backward and sdpa_varlen_backward take them:
// grad_out has out's shape and dq, dk, dv those of q, k, v (require_gradient_like); no
// gradient, nor dsinks, shares memory with the inputs, the option tensors or another
// (require_gradient_outputs; Hq: the query heads dsinks must match).
void require_backward_gradients(std::string_view op, const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const TensorView& lse, const TensorView& grad_out,
                                const SdpaOptions& options, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const TensorView* dsinks, std::int64_t Hq);

// Adds the scores output to a problem (checks it: shape, dtype, no dropout; the overlaps are
// require_outputs_apart's).
void attach_scores(SdpaProblem& p, const ScoresOutput& scores, std::string_view op = "sdpa");

}  // namespace attn::detail
