// attn::MultiHeadAttention — the whole layer, with PyTorch nn.MultiheadAttention's weights
// (state_dict names) and semantics (eval mode: no dropout).
//
//   Q = query·W_Qᵀ + b_Q    K = key·W_Kᵀ + b_K    V = value·W_Vᵀ + b_V      (projections, CBLAS sgemm)
//   split into heads by strides: (B, L, h, d_h) seen as (B, h, L, d_h), d_h = E / h
//   O_head = softmax(Q_head·K_headᵀ / √d_h + mask) · V_head                 (attn::sdpa)
//   output = concat(O_heads)·W_Oᵀ + b_O                                      (sgemm)
//
// Shapes (E = embed_dim, h = num_heads; B batch, Lq/Lk query/key lengths):
//   query (Lq, B, E), or (B, Lq, E) with batch_first, or unbatched (Lq, E)
//   key   (Lk, B, kdim)   value (Lk, B, vdim)      same layout as query
//   output like query; weights (B, Lq, Lk) averaged over heads or (B, h, Lq, Lk) per head
//   (unbatched: without B)
//
// Masks use PyTorch's conventions here, converted once to attn::sdpa's (docs/conventions.md):
//   attn_mask        (Lq, Lk) or (B·h, Lq, Lk) [unbatched (h, Lq, Lk)]; bool True = NOT allowed; float added
//   key_padding_mask (B, Lk) [unbatched (Lk,)]; bool True = padding (ignored); float added
//   causal           top_left: query i sees keys 0..i (PyTorch's is_causal); bottom_right: keys
//                    0..i + Lk − Lq (Lq < Lk: the last query sees every key), combined with the masks above
// A query that can see no key (e.g. every key of its batch item padded) gets attention
// output 0 and weights 0 — the layer output is then out_proj.bias. PyTorch gives NaN.
//
// Parameters (float32, PyTorch names; E_kv = num_kv_heads · d_h, = E unless GQA):
//   kdim == vdim == E:  in_proj_weight (E + 2·E_kv, E)     rows: W_Q, W_K, W_V
//   otherwise:          q_proj_weight (E, E), k_proj_weight (E_kv, kdim), v_proj_weight (E_kv, vdim)
//   bias:               in_proj_bias (E + 2·E_kv), out_proj.bias (E)
//   always:             out_proj.weight (E, E)
//   add_bias_kv:        bias_k (1, 1, E_kv), bias_v (1, 1, E_kv)
// num_kv_heads < num_heads (grouped-query attention) is an attn extension: query head j reads
// KV head j / (num_heads / num_kv_heads).
// add_bias_kv appends a key/value (bias_k, bias_v) after the Lk keys, add_zero_attn then a zero
// key/value, as PyTorch does: the masks allow them, the weights have Lk + 1 (+ 1) columns, and
// a causal mask is refused with them (pass a causal attn_mask).
//
// Score modifiers (docs/conventions.md "Score modifiers"; attn extensions, not in PyTorch):
//   sinks          a learned sink logit per head: parameter `sinks` (h,) — gpt-oss's state_dict
//                  name; from_state_dict turns it on when the tensor is there. It gets a gradient.
//   softcap        c > 0: every score s ← c·tanh(s/c) (Gemma 2). 0 = off.
//   alibi_slopes   (h,) ALiBi slopes: s −= m_h·|d(i) − j| (attn::alibi_slopes(h) gives the
//                  standard ones). d(i) is sdpa's bottom-right diagonal i + Lk − Lq (= i for
//                  self-attention, and the token's cache position in forward_incremental).
//                  Refused with add_bias_kv / add_zero_attn (their extra key has no position).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

class KVCache;  // include/attn/kv_cache.hpp
namespace detail {
struct PackedWeights;  // src/mha/packed_weights.hpp
}

struct MhaConfig {
    std::int64_t embed_dim = 0;     // E
    std::int64_t num_heads = 0;     // h; E must be divisible by h
    std::int64_t kdim = 0;          // key features; 0 means E
    std::int64_t vdim = 0;          // value features; 0 means E
    std::int64_t num_kv_heads = 0;  // K/V heads (GQA); 0 means num_heads; must divide num_heads
    bool bias = true;               // in_proj_bias and out_proj.bias
    bool batch_first = false;       // (B, L, E) instead of (L, B, E)
    bool add_bias_kv = false;       // append the key/value bias_k/bias_v (PyTorch's option)
    bool add_zero_attn = false;     // append a zero key/value (PyTorch's option)
    bool sinks = false;             // parameter `sinks` (h,): a sink logit per head (gpt-oss)
    double softcap = 0.0;           // logit softcap c (0 = off); as SdpaOptions::softcap: a normal finite float32
    std::vector<float> alibi_slopes = {};  // (h,) finite ALiBi slopes; empty = no ALiBi
    // Storage of the weight matrices (in_proj_weight or q/k/v_proj_weight, out_proj.weight):
    // float32, float16 or bfloat16. 16-bit weights are widened exactly inside the projection
    // GEMM (fp32 accumulation). Biases, bias_k/bias_v and sinks stay float32 (E-sized; they
    // are added in float32 anyway). Training (forward_train/backward) needs float32.
    DType param_dtype = DType::f32;
};

struct MhaForwardOptions {
    std::optional<TensorView> key_padding_mask;  // bool (True = padding) or float (added)
    std::optional<TensorView> attn_mask;         // bool (True = not allowed) or float (added)
    bool need_weights = true;                    // as PyTorch: weights are returned by default
    bool average_attn_weights = true;            // (B, Lq, Lk) mean over heads; false: (B, h, Lq, Lk)
    // Causal mask, combined with the masks above, aligned as in SdpaOptions (docs/conventions.md):
    // top_left: query i sees keys 0..i (PyTorch's is_causal); bottom_right: keys 0..i + Lk − Lq
    // (the last query sees every key: new tokens after Lk − Lq earlier ones, as in cross-attention
    // on a cache or incremental decoding). Lk counts the key's rows; key_padding_mask does not move it.
    Causal causal = Causal::none;
    Impl impl = Impl::automatic;                 // passed to attn::sdpa
    // dtype of `output` (float32, float16 or bfloat16); unset: the query's dtype when it is
    // float16/bfloat16, else float32. The weights are always float32.
    std::optional<DType> out_dtype;
    // dtype of the projected Q, K, V and of the attention output O between the layer's GEMMs.
    // Unset or float32: float32, the most accurate (a 16-bit layer's arithmetic is then the
    // float32 layer's on the widened values). float16 / bfloat16: each is rounded once to it
    // after its float32 accumulation (bias included), as PyTorch's 16-bit layer stores them,
    // and attention and the out projection read the 16-bit values — with bfloat16 weights and
    // input on a CPU with AVX-512 BF16 all three products then run on bf16 pairs. Bounds in
    // docs/conventions.md ("16-bit MHA"). Inference: forward/forward_into (and forward_packed,
    // MhaPackedOptions); forward_train refuses it.
    std::optional<DType> intermediate_dtype;
};

// Packed input (forward_packed): sequences of different lengths concatenated along the token
// axis, as attn::sdpa_varlen takes them (include/attn/sdpa_varlen.hpp).
struct MhaPackedOptions {
    Causal causal = Causal::none;  // per sequence; bottom-right aligns to each sequence's own lengths
    Impl impl = Impl::automatic;   // passed to attn::sdpa_varlen
    // As MhaForwardOptions::intermediate_dtype (forward_packed only; forward_packed_train refuses it).
    std::optional<DType> intermediate_dtype;
};

struct MhaOutput {
    Tensor output;   // shaped like query, float32 (or out_dtype: the query's when 16-bit)
    Tensor weights;  // float32; empty unless need_weights
};

// Scratch buffers of a forward pass, kept between calls to avoid re-allocating (and
// re-faulting) large buffers. Not shared between threads.
struct MhaWorkspace {
    Tensor proj_q, proj_kv, proj_v, attn_out, head_weights, input_copy[3], out_f32;
    Tensor proj16[3], attn_out16;  // 16-bit intermediates (MhaForwardOptions::intermediate_dtype)
};

// Training (docs/mha-backward.md): forward_train keeps what backward needs — float32
// copies of the inputs and masks, the projected Q, K, V (K/V with the appended bias_k /
// zero rows), the attention output O before out_proj and the softmax lse — so the state
// owns everything and the caller's tensors may change or die before backward.
struct MhaTrainOptions {
    double dropout_p = 0.0;  // dropout on the attention weights (0 ≤ p < 1), as PyTorch's
    // The keep mask is a pure function of (seed, b, head, i, j); needed when dropout_p > 0 (as
    // SdpaOptions::dropout_seed). The state keeps it: backward() drops what the forward dropped.
    std::optional<std::uint64_t> dropout_seed;
};

struct MhaForwardState {
    MhaConfig layer;             // the configuration of the layer that filled it (backward checks it)
    Shape query_shape, key_shape, value_shape;
    std::int64_t B = 0, Lq = 0, Lk = 0, Lkx = 0;  // Lkx = Lk + appended keys
    bool batched = true;
    Tensor x[3];                 // query, key, value as contiguous float32 (the inputs' layout)
    Tensor q, k, v;              // (Nq, E) rows in the query's row order; (B·Lkx, E_kv) batch-major
    Tensor attn_out;             // (Nq, E) O before out_proj, heads concatenated
    Tensor lse;                  // (B, h, Lq) float32
    Tensor mask_store[4];        // owned masks the saved SdpaOptions point to
    Tensor sinks, alibi;         // owned copies of the score modifiers the saved options use
    SdpaOptions sdpa;            // masks, causal, dropout, modifiers — reused by the backward
    // forward_packed_train only (empty otherwise; backward() branches on them): int64 copies
    // of cu_seqlens. x, q, k, v, attn_out are then packed rows (T, ·) and lse is (Tq, h).
    Tensor cu_seqlens_q, cu_seqlens_k;
};

// ∂loss/∂x for every parameter (state_dict names and order) and input, all float32 (training
// parameters are float32, the sums too): a caller that wants torch's dtypes — each gradient in its
// tensor's — rounds each once, as `attn mha --grads` does (docs/conventions.md, "The gradients' dtypes").
struct MhaGradients {
    std::vector<std::pair<std::string, Tensor>> params;
    Tensor query, key, value;  // shaped like the inputs, float32, one per argument: for
                               // self-attention (the same tensor passed 3×) the input's
                               // gradient is query + key + value, which the caller adds
};

// Thread safety, as for any C++ object: the const members (every forward, forward_train,
// backward, parameter/state_dict reads) may run on one layer from several threads at once, each
// with its own workspace, state and KV cache (forward_incremental appends to it); the others (load_state_dict, set_param_dtype,
// pack_weights, unpack_weights, a write through a parameter view) need the layer to themselves —
// a forward running while pack_weights replaces the packed panels reads freed memory (found
// with ThreadSanitizer; the rule, not the library, keeps it from happening). Python's MultiheadAttention takes a lock per call.
class MultiHeadAttention {
public:
    // Checks the configuration (throws attn::Error) and allocates zeroed parameters.
    explicit MultiHeadAttention(const MhaConfig& config);

    // Builds a layer from a PyTorch state_dict: E, kdim, vdim, bias, num_kv_heads and
    // add_bias_kv are read from the tensors (add_zero_attn has no tensor: it is given here); the
    // tensors are then loaded as by load_state_dict. A `sinks` tensor turns on config.sinks;
    // softcap and ALiBi slopes have no tensor and are given here.
    // The weight matrices keep their 16-bit dtype when every one of them is float16 (or every
    // one bfloat16) — a 16-bit checkpoint stays 16-bit in memory — else they are float32;
    // `param_dtype` overrides (converting on load).
    static MultiHeadAttention from_state_dict(const std::vector<std::pair<std::string, TensorView>>& tensors,
                                              std::int64_t num_heads, bool batch_first = false, double softcap = 0.0,
                                              std::vector<float> alibi_slopes = {},
                                              std::optional<DType> param_dtype = std::nullopt,
                                              bool add_zero_attn = false);

    const MhaConfig& config() const { return config_; }
    std::int64_t head_dim() const { return config_.embed_dim / config_.num_heads; }

    // Names and shapes of the parameters this configuration has, in state_dict order.
    std::vector<std::pair<std::string, Shape>> parameter_shapes() const;
    // A parameter's storage (writable): the weight matrices in config().param_dtype, the
    // others float32; throws attn::Error for an unknown name. The view (and state_dict()'s) is
    // valid until the layer is destroyed or set_param_dtype replaces that storage.
    TensorView parameter(std::string_view name) const;

    // Converts the weight matrices' storage to float32, float16 or bfloat16 (to 16 bits:
    // rounded to nearest even; back to float32: exact). A new dtype is new storage: earlier
    // views of the weight matrices from parameter() or state_dict() dangle.
    void set_param_dtype(DType dtype);

    // Copies every tensor into the parameters (converted to each parameter's dtype).
    // The set of names must match exactly: a missing, unexpected or mis-shaped tensor is
    // an error naming it with the expected and the actual shape. Nothing changes on error.
    void load_state_dict(const std::vector<std::pair<std::string, TensorView>>& tensors);
    std::vector<std::pair<std::string, TensorView>> state_dict() const;

    // key and value may be the query itself (self-attention: one fused QKV GEMM), one
    // shared tensor (a fused KV GEMM) or two tensors. Inputs may be float32/64/16, bf16,
    // any strides (non-contiguous or non-float32 inputs are copied once).
    MhaOutput forward(const TensorView& query, const TensorView& key, const TensorView& value,
                      const MhaForwardOptions& options = {}, MhaWorkspace* workspace = nullptr) const;

    // The same into caller-owned contiguous outputs: output float32, float16 or bfloat16 (its
    // dtype is the one written; options.out_dtype, if set, must match it), weights float32 (null unless
    // options.need_weights). Everything is checked before anything is written. The output may be
    // exactly query, key or value (the same data, dtype, shape and strides: the layer in place —
    // they are read only by the input projections, before the output is written) or share no
    // memory with them; weights share memory with nothing (docs/conventions.md, "MultiHeadAttention").
    void forward_into(const TensorView& query, const TensorView& key, const TensorView& value,
                      const MhaForwardOptions& options, const TensorView& output, const TensorView* weights,
                      MhaWorkspace* workspace = nullptr) const;

    // Packed variable-length input (no padding): query (Tq, E), key (Tk, kdim), value (Tk, vdim)
    // float32/64/16/bf16, any strides; cu_seqlens_q / cu_seqlens_k (N+1,) int32/int64 as in
    // sdpa_varlen. Sequence b's output rows are exactly what forward() gives that sequence
    // alone (batch of one, no mask, the same causal), up to the GEMMs' rounding.
    // Returns (Tq, E) in the query's dtype when 16-bit, else float32. add_bias_kv / add_zero_attn are refused (no packed meaning yet).
    Tensor forward_packed(const TensorView& query, const TensorView& key, const TensorView& value,
                          const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                          const MhaPackedOptions& options = {}) const;

    // Training on packed input: forward_packed's output, with dropout on the attention weights
    // (sequence b's keep mask is sdpa_varlen's: seed varlen_dropout_seed(dropout_seed, b)),
    // saving into `state` what backward() needs. backward() then returns the gradients of the
    // parameters and of the packed query (Tq, E), key (Tk, kdim) and value (Tk, vdim).
    Tensor forward_packed_train(const TensorView& query, const TensorView& key, const TensorView& value,
                                const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                const MhaPackedOptions& options, const MhaTrainOptions& train,
                                MhaForwardState& state) const;

    // Training forward: the same output as forward() (need_weights is ignored; the output in
    // forward()'s dtype: out_dtype, else a 16-bit query's dtype, else float32 — rounded once from
    // the float32 result) with dropout on the attention weights, saving into `state` what
    // backward() needs.
    Tensor forward_train(const TensorView& query, const TensorView& key, const TensorView& value,
                         const MhaForwardOptions& options, const MhaTrainOptions& train, MhaForwardState& state) const;
    // Gradients for the forward_train call that filled `state`, given grad_output =
    // ∂loss/∂output (shaped like the output, any floating dtype/strides). Parameters must
    // not have changed since that forward.
    MhaGradients backward(const MhaForwardState& state, const TensorView& grad_output) const;

    // Incremental (KV-cached) self-attention, for a decoder fed a few tokens at a time
    // (include/attn/mha_incremental.hpp describes it): projects x_new's T tokens, appends
    // their K, V to `cache` and attends over each sequence's cache rows, causal bottom-right
    // per sequence. Returns the output, shaped like x_new, in x_new's dtype when 16-bit (else float32).
    Tensor forward_incremental(const TensorView& x_new, KVCache& cache, MhaWorkspace* workspace = nullptr) const;
    // The same into a caller-owned contiguous output shaped like x_new: float32, float16 or bfloat16;
    // exactly x_new (in place) or apart from it, as forward_into's output and its inputs.
    void forward_incremental_into(const TensorView& x_new, KVCache& cache, const TensorView& output,
                                  MhaWorkspace* workspace = nullptr) const;

    // Shapes forward() returns for these inputs (after checking them).
    Shape output_shape(const TensorView& query) const;
    Shape weights_shape(const TensorView& query, const TensorView& key, bool average_attn_weights) const;

    // config's softcap, ALiBi slopes and sinks set on an sdpa call's options (views into
    // this layer: valid while it lives and its parameters do not change).
    void score_modifiers(SdpaOptions& options) const;

    // in_proj_weight, q/k/v_proj_weight, out_proj.weight: the parameters stored in param_dtype.
    static bool is_weight_matrix(std::string_view name);

    // Pre-packed weights (inference). The projection GEMM packs its weight operand into panels
    // on every call; pack_weights() packs every weight matrix once (for the kernel-table row in
    // use), and forward, forward_into, forward_packed and forward_incremental then read those
    // panels: the same values in the same layout, so their results are bit-identical to the
    // unpacked layer's, on any thread count. load_state_dict and set_param_dtype re-pack them;
    // forward_train, forward_packed_train and backward always read the parameters themselves.
    // A write through a view from parameter() or state_dict() is NOT seen by the packed copy:
    // call pack_weights() again after one (or unpack_weights()). Memory: float32 panels of each
    // weight matrix (its float32 bytes, rounded up to the GEMM's sliver width). load_state_dict
    // and set_param_dtype on a packed layer hold the old panels, the new ones and the converted
    // matrices at once for a moment: the price of leaving the layer as it was on any failure.
    void pack_weights();
    void unpack_weights() { packed_.reset(); }
    bool weights_packed() const { return packed_ != nullptr; }
    // (The library's projections: the packed panels, or null.)
    const detail::PackedWeights* packed_weights() const { return packed_.get(); }

private:
    // attn::Error unless the layer holds its parameters (a moved-from one holds none).
    void require_parameters() const;
    // The packed panels of the weight matrices, each read from `replace` where it names the
    // matrix, else from params_ — so that load_state_dict and set_param_dtype can pack the new
    // weights before they change anything (out of memory there leaves the layer as it was).
    std::shared_ptr<const detail::PackedWeights> packed_with(const std::map<std::string, const Tensor*, std::less<>>& replace) const;

    MhaConfig config_;
    Tensor alibi_;  // config_.alibi_slopes as a float32 (h,) tensor, empty without ALiBi
    std::map<std::string, Tensor, std::less<>> params_;
    // Immutable once built; replaced (pack_weights, load_state_dict), never changed in place —
    // not while a forward runs (the class's thread-safety rule above).
    std::shared_ptr<const detail::PackedWeights> packed_;
};

}  // namespace attn
