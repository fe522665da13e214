// attn::sdpa — scaled dot-product attention:  O = softmax(Q·Kᵀ·scale + mask) · V
//
//   q: (B, Hq,  Lq, Dk)     any strides; float32 (float64 runs on the reference only)
//   k: (B, Hkv, Lk, Dk)     Hq % Hkv == 0: query head h reads KV head h / (Hq / Hkv)  (GQA; Hkv = 1 is MQA)
//                           Q, K and V may be float16/bfloat16: every kernel reads them directly
//                           (per tile; docs/conventions.md, "16-bit inputs and outputs")
//   v: (B, Hkv, Lk, Dv)
//   out: (B, Hq, Lq, Dv)    float32, float64, float16 or bfloat16 (rounded once), written completely
//   lse: (B, Hq, Lq)        optional: natural log-sum-exp of each row of scaled, masked scores
//   weights: (B, Hq, Lq, Lk) optional: the softmax probabilities A
//
// Masks (docs/conventions.md draws them) are combined with AND; every one is optional:
//   bool_mask      keep-mask, true = may attend, broadcastable to (B, Hq, Lq, Lk)
//   additive_mask  float bias added to the scaled scores (−inf allowed), same broadcasting
//   key_lengths    (B,) int32/int64: sequence b has valid keys 0..n_b−1, n_b = key_lengths[b]
//                  (n_b = Lk without key_lengths)
//   causal         query i of sequence b sees keys 0..d_b(i), its diagonal:
//                  top_left:     d_b(i) = i                 (PyTorch's is_causal)
//                  bottom_right: d_b(i) = i + n_b − Lq      (the new tokens of a KV cache:
//                                per sequence, as FlashAttention's cache_seqlens and ONNX's
//                                nonpad_kv_seqlen; a row with d_b(i) < 0 sees no key)
//   window         query i sees keys d_b(i)−left .. d_b(i)+right, d_b(i) as above for window.align
//   query_offset   replaces both alignments by one number per sequence: d_b(i) = i + offset_b
//                  (the position of query 0 among the keys; top-left = 0, bottom-right = n_b − Lq)
// Score modifiers (docs/conventions.md, "Score modifiers"), applied in this order, before the masks:
//   softcap        c > 0: s = c·tanh(s / c) (Gemma 2); masked keys stay −inf
//   alibi_slopes   s += −m_h·|d_b(i) − j|, d_b(i) the bottom-right diagonal (or query_offset)
// and in the softmax:
//   sinks          per-head logit σ_h that takes probability mass but adds no value; lse
//                  includes it; a row with no visible key then gives out = 0, lse = σ_h
// A masked position gets exactly zero weight. A row with no visible key gives
// out = 0, weights = 0 and lse = −inf — never NaN.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

enum class Causal { none, top_left, bottom_right };
enum class Align { top_left, bottom_right };

struct Window {
    std::int64_t left = -1;   // keys before the diagonal a query may see; −1 = unbounded
    std::int64_t right = -1;  // keys after the diagonal; −1 = unbounded
    Align align = Align::top_left;
    bool active() const { return left >= 0 || right >= 0; }
};

// The position of query 0 among the keys, one number for every sequence or one per
// sequence: query i of sequence b then has its diagonal at d_b(i) = i + offset_b, for
// causal masking and for the window alike (docs/conventions.md draws it). It expresses
// every alignment: top-left is 0, bottom-right is key_lengths[b] − Lq, and e.g. ONNX's
// past-cache case (queries start at the past length while the new K block is longer than
// Q) is offset = past length.
struct QueryOffset {
    std::int64_t value = 0;                  // every sequence; |value| <= 2^60
    std::optional<TensorView> per_sequence;  // (B,) int32/int64; when set, replaces value

    QueryOffset() = default;
    QueryOffset(std::int64_t v) : value(v) {}                  // NOLINT(google-explicit-constructor)
    QueryOffset(const TensorView& t) : per_sequence(t) {}      // NOLINT(google-explicit-constructor)
};

// Where a call sits in a larger problem, for dropout's keep rule only: the call's weight
// (b, h, i, j) takes the keep decision of (batch + b, head + h, row + i, key + j) of the
// whole, so the pieces of a split problem (the blocks of ring attention: rows and keys of one
// rank, a slice of the batch) drop exactly what the whole problem drops with the same seed.
// Every field >= 0; batch + B, head + Hq and row + Lq at most 2^32, key + Lk at most 2^34 (the
// Philox counter's words, src/core/dropout.hpp). Masks, alignment and the other options keep
// their own meaning; only the random numbers move.
struct DropoutOrigin {
    std::int64_t batch = 0, head = 0, row = 0, key = 0;
};

// Which kernel runs. `automatic` picks the fastest kernel that supports the call.
enum class Impl { automatic, reference, flash, decode };

struct SdpaOptions {
    std::optional<double> scale;            // default 1/sqrt(Dk); must be finite
    Causal causal = Causal::none;
    Window window{};
    std::optional<TensorView> bool_mask;      // dtype bool
    std::optional<TensorView> additive_mask;  // dtype float32, float64, float16 or bfloat16 (widened exactly)
    std::optional<TensorView> key_lengths;    // dtype int32 or int64, shape (B,)
    // When set, causal (top_left and bottom_right alike) and the window align to
    // d_b(i) = i + offset_b; causal and window.align then only say whether to mask.
    std::optional<QueryOffset> query_offset;
    Impl impl = Impl::automatic;
    // Dropout on the attention weights (training): each weight A[b,h,i,j] is kept with
    // probability 1 − dropout_p and scaled by 1/(1 − dropout_p), else zeroed. The keep
    // decision is a pure function of (dropout_seed, b, h, i, j) (Philox4x32-10, see
    // src/core/dropout.hpp), so the backward regenerates it and no thread count changes
    // it. 0 ≤ dropout_p < 1; dropout_p = 0 is exactly no dropout. lse is that of the
    // undropped softmax; `weights`, when requested, are the dropped, rescaled weights
    // that multiply V (as torch's MultiheadAttention returns them).
    // The seed is the caller's (attn has no global generator): dropout_p > 0 without one is an
    // attn::Error naming dropout_seed, as in Python and the CLI (docs/conventions.md, "Dropout").
    // A training loop passes a new seed each step, and the backward the forward's.
    double dropout_p = 0.0;
    std::optional<std::uint64_t> dropout_seed;  // any value, 0 included; needed when dropout_p > 0
    DropoutOrigin dropout_origin{};  // (0, 0, 0, 0) = the call is the whole problem
    // Logit soft-capping: s ← softcap·tanh(s / softcap) right after the scale, before any
    // mask or bias. 0 = off; otherwise a finite float32 >= FLT_MIN.
    double softcap = 0.0;
    // ALiBi slopes m_h, float32, shape (Hq,) or (B, Hq), finite: s ← s − m_h·|d_b(i) − j|
    // (FlashAttention's convention: measured from the bottom-right diagonal d_b(i) =
    // i + n_b − Lq, or from query_offset when given). attn::alibi_slopes(H) gives the
    // standard ones. No gradient.
    std::optional<TensorView> alibi_slopes;
    // Attention sinks σ_h, float32, shape (Hq,), finite: one extra softmax logit per head
    // with no value (gpt-oss, StreamingLLM): p_j = e^{s_j} / (e^{σ_h} + Σ_k e^{s_k}).
    std::optional<TensorView> sinks;
};

// The ALiBi paper's slopes for `heads` heads, float32 (heads,): for n a power of two,
// m_h = 2^(−8(h+1)/n); otherwise those of the largest power of two n' < heads followed by
// every other slope of 2n' (2^(−4(2k+1)/n'), k = 0, 1, …). heads >= 1.
Tensor alibi_slopes(std::int64_t heads);

// The score matrix at one stage of the score rule (ONNX Attention's qk_matmul_output_mode
// 0, 1, 2; the weights are mode 3): scaled = scale·q·k, softcapped = after the softcap (=
// scaled without one), masked = after ALiBi and every mask (masked keys −inf).
enum class ScoreStage { scaled, softcapped, masked };
std::string_view score_stage_name(ScoreStage s);
ScoreStage parse_score_stage(std::string_view name);  // "scaled", "softcapped", "masked"

// An optional output of sdpa: (B, Hq, Lq, Lk) float32/float64, written completely. O(Lq·Lk)
// like weights: the flash kernel computes it tile by tile in its second pass. Refused
// together with dropout.
struct ScoresOutput {
    TensorView view;
    ScoreStage stage = ScoreStage::masked;
};

// Filled by sdpa when asked: which kernel ran and why faster ones were declined.
struct SdpaReport {
    std::string kernel;       // e.g. "reference"
    std::string explanation;  // one line per kernel considered
};

// Throws attn::Error (naming the argument, the expectation and what was given) before
// writing anything. lse and weights may be null.
void sdpa(const TensorView& q, const TensorView& k, const TensorView& v, const SdpaOptions& options,
          const TensorView& out, const TensorView* lse = nullptr, const TensorView* weights = nullptr,
          SdpaReport* report = nullptr, const ScoresOutput* scores = nullptr);

// The shapes of sdpa's outputs for these inputs, after sdpa's own checks of Q, K and V (rank,
// float dtype, every dim >= 1, how they agree; attn::Error as sdpa throws it). For callers that
// allocate the outputs from the inputs (the CLI): a malformed input is named before a buffer
// sized from it is asked for.
struct SdpaShapes {
    Shape out;      // (B, Hq, Lq, Dv)
    Shape lse;      // (B, Hq, Lq)
    Shape weights;  // (B, Hq, Lq, Lk): also the scores'
};
SdpaShapes sdpa_output_shapes(const TensorView& q, const TensorView& k, const TensorView& v);

std::string_view impl_name(Impl impl);
Impl parse_impl(std::string_view name);        // throws attn::Error on an unknown name
Causal parse_causal(std::string_view name);    // "none", "top-left", "bottom-right"

}  // namespace attn
