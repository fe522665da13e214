// Incremental self-attention through a KV cache (MultiHeadAttention::forward_incremental,
// include/attn/mha_incremental.hpp): fused QKV GEMM for the new tokens → K, V appended to
// the cache → one attention call over the cache → out projection.
#include "attn/mha_incremental.hpp"

#include <vector>

#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "attn/decode.hpp"
#include "attn/sdpa.hpp"
#include "inputs.hpp"
#include "linear.hpp"
#include "projection.hpp"
#include "../core/threads.hpp"

namespace attn {
namespace {

using detail::fail;
using detail::fail_type;
using detail::kMha;

// Sizes of x_new: T new tokens for each of B sequences; row of (b, t) = b·rb + t·rl.
struct Layout {
    std::int64_t B = 1, T = 0;
    detail::Rows rows;
};

Layout check_input(const MultiHeadAttention& layer, const TensorView& x) {
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim;
    if (c.kdim != E) fail(kMha, "forward_incremental: the layer's kdim must equal embed_dim (self-attention) but is ", c.kdim);
    if (c.vdim != E) fail(kMha, "forward_incremental: the layer's vdim must equal embed_dim (self-attention) but is ", c.vdim);
    if (c.add_bias_kv || c.add_zero_attn) {
        fail(kMha, "forward_incremental: layers with add_bias_kv or add_zero_attn are not supported (their extra key is "
                   "not a cache position)");
    }
    if (x.data() == nullptr) fail(kMha, "x_new: data pointer is null");
    if (!is_floating(x.dtype())) fail_type(kMha, "x_new: dtype must be floating but got ", dtype_name(x.dtype()));
    if (x.rank() != 2 && x.rank() != 3) {
        fail(kMha, "x_new: expected rank 3 (T, B, E) / (B, T, E) or 2 (T, E) but got shape ", x.shape());
    }
    if (x.dim(x.rank() - 1) != E) fail(kMha, "x_new: last dimension must be embed_dim = ", E, " but got shape ", x.shape());
    Layout l;
    const bool batched = x.rank() == 3;
    l.B = batched ? x.dim(c.batch_first ? 0 : 1) : 1;
    l.T = x.dim(batched && c.batch_first ? 1 : 0);
    l.rows = detail::rows_of(batched, c.batch_first, l.B, l.T);
    if (l.T < 1) fail(kMha, "x_new: needs at least one new token but got shape ", x.shape());
    if (l.B < 1) fail(kMha, "x_new: needs at least one sequence but got shape ", x.shape());
    return l;
}

void check_cache(const MultiHeadAttention& layer, const KVCache& cache, const Layout& l) {
    const MhaConfig& c = layer.config();
    const std::int64_t dh = layer.head_dim();
    if (cache.batch() == 0) fail(kMha, "cache: holds no storage (it was moved from)");  // as decode_attention
    if (cache.batch() != l.B) fail(kMha, "cache: batch must equal x_new's batch ", l.B, " but is ", cache.batch());
    if (cache.kv_heads() != c.num_kv_heads) {
        fail(kMha, "cache: kv_heads must equal the layer's K/V heads ", c.num_kv_heads, " but is ", cache.kv_heads());
    }
    if (cache.head_dim() != dh) fail(kMha, "cache: head_dim must equal the layer's head dim E/h = ", dh, " but is ", cache.head_dim());
    if (cache.value_dim() != dh) {
        fail(kMha, "cache: value_dim must equal the layer's head dim E/h = ", dh, " but is ", cache.value_dim());
    }
}

// O = attention of the new queries over each sequence's cache rows, causal bottom-right per
// sequence (new token t of sequence b, at position n_b − T + t, sees positions 0 .. n_b − T + t):
// the rule of docs/conventions.md with key_lengths = the cache's lengths, one call for all
// sequences whatever their lengths.
// The layer's score modifiers ride along (ALiBi measures from the token's cache position).
void attend(const MultiHeadAttention& layer, const TensorView& Q, const KVCache& cache, const TensorView& O) {
    SdpaOptions o;
    o.causal = Causal::bottom_right;
    layer.score_modifiers(o);
    // The decode kernel for a few rows per KV head, else flash (the dispatch's one rule); both
    // read 16-bit storage per tile.
    decode_attention(Q, cache, o, O);
}

}  // namespace

// x_new (T, B, E) | (B, T, E) | (T, E)  →  output the same shape, float32.
void MultiHeadAttention::forward_incremental_into(const TensorView& x_new, KVCache& cache, const TensorView& output,
                                                  MhaWorkspace* workspace) const {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    // The checks' lists and messages are the call's bookkeeping: a refusal there is
    // attn::OutOfMemory saying so (it was a bare std::bad_alloc), nothing written yet.
    Layout l;
    detail::naming_bookkeeping("the MHA layer's forward_incremental argument checks", [&] {
        l = check_input(*this, x_new);
        check_cache(*this, cache, l);
        detail::check_output("output", output, x_new.shape());
        // The append writes the cache's storage (and growing moves it): the output cannot live there.
        const std::string op = std::string(kMha) + ": forward_incremental";
        detail::require_disjoint(op, output, "output", cache.keys(), "the cache's keys");
        detail::require_disjoint(op, output, "output", cache.values(), "the cache's values");
        detail::require_apart_from_parameters(op, *this, {{&output, "output"}});
        detail::require_output_in_place_or_apart(op, output, {{&x_new, "x_new"}});
        // The append's check and the sinks' (decode_attention refuses a non-finite sink only after the
        // append, which may have grown the cache; a parameter changed in place can hold one —
        // load_state_dict refuses them), before the projection a refused call would waste.
        cache.require_room(l.T);
        if (config_.sinks) detail::check_finite_sinks(parameter("sinks"), "forward_incremental: parameter 'sinks'");
    });
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, h = c.num_heads, dh = head_dim(), hkv = c.num_kv_heads, Ekv = hkv * dh;
    const std::int64_t B = l.B, T = l.T, N = B * T, n = E + 2 * Ekv;
    MhaWorkspace local;
    MhaWorkspace& ws = workspace != nullptr ? *workspace : local;

    // ---- Q K V of the new tokens: one GEMM (N, E)·[W_Q; W_K; W_V]ᵀ → (N, E + 2·E_kv) ----
    const detail::InputWeights w = detail::input_weights(*this, true);
    float* qkv = detail::ensure(ws.proj_q, Shape{N, n}, "the MHA layer's projected Q, K and V");
    detail::linear(detail::as_rows(x_new, ws.input_copy[0], detail::kNewTokenRows), N, E, E, w.wq, n, w.bias, qkv, n);
    const TensorView Q = detail::heads_view(qkv, n, 0, l.rows, B, h, T, dh);
    const TensorView K = detail::heads_view(qkv, n, E, l.rows, B, hkv, T, dh);
    const TensorView V = detail::heads_view(qkv, n, E + Ekv, l.rows, B, hkv, T, dh);

    // The step's buffers before the cache changes: a failed allocation leaves it as it was.
    float* o = detail::ensure(ws.attn_out, Shape{N, E}, "the MHA layer's attention output O (rows, E)");
    const bool f32_out = output.dtype() == DType::f32;
    float* y = f32_out ? output.data_as<float>() : detail::ensure(ws.out_f32, Shape{N, E}, "the MHA layer's float32 output rows");

    std::vector<std::int64_t> old_len;
    detail::resize_or_throw(old_len, B, "the cache's lengths before the step");
    for (std::int64_t b = 0; b < B; ++b) old_len[static_cast<std::size_t>(b)] = cache.length(b);
    cache.append(K, V);  // throws before writing when T tokens do not fit
    try {
        attend(*this, Q, cache, detail::heads_view(o, E, 0, l.rows, B, h, T, dh));
        // ---- out projection straight into the output (x_new's row order) ----
        detail::linear(o, N, E, E, detail::out_weight(*this, true),
                       E, c.bias ? parameter("out_proj.bias").data_as<const float>() : nullptr, y, E);
        if (!f32_out) detail::store_output(y, output);
    } catch (...) {
        // Leave the cache's tokens as they were: the step did not happen (attention or the
        // projection's workspace can fail after the append). A growth stays (mha_incremental.hpp).
        for (std::int64_t b = 0; b < B; ++b) cache.truncate(b, old_len[static_cast<std::size_t>(b)]);
        throw;
    }
}

Tensor MultiHeadAttention::forward_incremental(const TensorView& x_new, KVCache& cache, MhaWorkspace* workspace) const {
    check_input(*this, x_new);
    Tensor out(detail::output_dtype(std::nullopt, x_new.dtype()), x_new.shape(), false, "the MHA layer's output");
    forward_incremental_into(x_new, cache, out.view(), workspace);
    return out;
}

}  // namespace attn
