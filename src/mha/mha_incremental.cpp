// Incremental self-attention through a KV cache (include/attn/mha_incremental.hpp):
//   fused QKV GEMM for the new tokens → K, V appended to the cache → decode kernel
//   (T <= 16) or sdpa per sequence (prefill) → out projection.
#include "attn/mha_incremental.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "linear.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error("mha_forward_incremental: " + msg); }

std::string num(std::int64_t v) { return std::to_string(v); }

float* ensure(Tensor& t, const Shape& shape) {
    if (t.data() == nullptr || t.dtype() != DType::f32 || !(t.shape() == shape)) t = Tensor(DType::f32, shape);
    return t.data_as<float>();
}

// Sizes of x_new: T new tokens for each of B sequences; row of (b, t) = b·rb + t·rl.
struct Layout {
    std::int64_t B = 1, T = 0, rb = 0, rl = 1;
};

Layout check_input(const MultiHeadAttention& layer, const TensorView& x) {
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim;
    if (c.kdim != 0 && c.kdim != E) fail("the layer's kdim must equal embed_dim (self-attention) but is " + num(c.kdim));
    if (c.vdim != 0 && c.vdim != E) fail("the layer's vdim must equal embed_dim (self-attention) but is " + num(c.vdim));
    if (c.add_bias_kv || c.add_zero_attn) fail("layers with add_bias_kv or add_zero_attn are not supported (their extra key is not a cache position)");
    if (x.data() == nullptr) fail("x_new: data pointer is null");
    if (!is_floating(x.dtype())) fail("x_new: dtype must be floating but got " + std::string(dtype_name(x.dtype())));
    if (x.rank() != 2 && x.rank() != 3) fail("x_new: expected rank 3 (T, B, E) / (B, T, E) or 2 (T, E) but got shape " + x.shape().str());
    if (x.dim(x.rank() - 1) != E) fail("x_new: last dimension must be embed_dim = " + num(E) + " but got shape " + x.shape().str());
    Layout l;
    if (x.rank() == 2) {
        l.T = x.dim(0);
        l.rb = 0;
        l.rl = 1;
    } else if (c.batch_first) {
        l.B = x.dim(0);
        l.T = x.dim(1);
        l.rb = l.T;
        l.rl = 1;
    } else {
        l.T = x.dim(0);
        l.B = x.dim(1);
        l.rb = 1;
        l.rl = l.B;
    }
    if (l.T < 1) fail("x_new: needs at least one new token but got shape " + x.shape().str());
    if (l.B < 1) fail("x_new: needs at least one sequence but got shape " + x.shape().str());
    return l;
}

void check_cache(const MultiHeadAttention& layer, const KVCache& cache, const Layout& l) {
    const MhaConfig& c = layer.config();
    const std::int64_t hkv = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads, dh = layer.head_dim();
    if (cache.batch() != l.B) fail("cache: batch must equal x_new's batch " + num(l.B) + " but is " + num(cache.batch()));
    if (cache.kv_heads() != hkv) fail("cache: kv_heads must equal the layer's K/V heads " + num(hkv) + " but is " + num(cache.kv_heads()));
    if (cache.head_dim() != dh) fail("cache: head_dim must equal the layer's head dim E/h = " + num(dh) + " but is " + num(cache.head_dim()));
    if (cache.value_dim() != dh) fail("cache: value_dim must equal the layer's head dim E/h = " + num(dh) + " but is " + num(cache.value_dim()));
}

}  // namespace

// x_new (T, B, E) | (B, T, E) | (T, E)  →  output the same shape, float32.
void mha_forward_incremental_into(const MultiHeadAttention& layer, const TensorView& x_new, KVCache& cache,
                                  const TensorView& output, MhaWorkspace* workspace) {
    const Layout l = check_input(layer, x_new);
    check_cache(layer, cache, l);
    if (output.dtype() != DType::f32 || !output.is_contiguous() || !(output.shape() == x_new.shape())) {
        fail("output: expected contiguous float32 of shape " + x_new.shape().str() + " but got " +
             std::string(dtype_name(output.dtype())) + " " + output.shape().str() + (output.is_contiguous() ? "" : " (non-contiguous)"));
    }
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim, h = c.num_heads, dh = layer.head_dim();
    const std::int64_t hkv = c.num_kv_heads > 0 ? c.num_kv_heads : h, Ekv = hkv * dh;
    const std::int64_t B = l.B, T = l.T, N = B * T, n = E + 2 * Ekv;
    MhaWorkspace local;
    MhaWorkspace& ws = workspace != nullptr ? *workspace : local;
    const float* x = nullptr;
    if (x_new.dtype() == DType::f32 && x_new.is_contiguous()) {
        x = x_new.data_as<const float>();
    } else {
        ws.input_copy[0] = to_dtype(x_new, DType::f32);
        x = ws.input_copy[0].data_as<const float>();
    }

    // ---- Q K V of the new tokens: one GEMM (N, E)·[W_Q; W_K; W_V]ᵀ → (N, E + 2·E_kv) ----
    const float* w = layer.parameter("in_proj_weight").data_as<const float>();
    const float* bias = c.bias ? layer.parameter("in_proj_bias").data_as<const float>() : nullptr;
    float* qkv = ensure(ws.proj_q, Shape{N, n});
    detail::linear(x, N, E, E, w, n, bias, qkv, n);
    auto heads = [&](float* buf, std::int64_t ld, std::int64_t col, std::int64_t nh) {
        return TensorView(buf + col, DType::f32, Shape{B, nh, T, dh}, Strides{l.rb * ld, dh, l.rl * ld, 1});
    };
    const TensorView Q = heads(qkv, n, 0, h), K = heads(qkv, n, E, hkv), V = heads(qkv, n, E + Ekv, hkv);

    std::vector<std::int64_t> old_len = cache.lengths();
    cache.append(K, V);  // throws before writing when T tokens do not fit

    // ---- attention of the new tokens over each sequence's cache, O as (rows, h, d_h) ----
    float* o = ensure(ws.attn_out, Shape{N, E});
    const TensorView O = heads(o, E, 0, h);
    try {
        if (T <= kMaxDecodeQueries) {
            SdpaOptions d;  // causal bottom-right per sequence: exactly the cache's new rows
            d.causal = Causal::bottom_right;
            decode_attention(Q, cache, d, O);
        } else {
            // Prefill block: per sequence (lengths may differ, and sdpa's bottom-right
            // alignment is per call), keys 0 .. n_b − 1 with the block's T queries last.
            SdpaOptions so;
            so.causal = Causal::bottom_right;
            const TensorView keys = cache.keys(), values = cache.values();
            for (std::int64_t b = 0; b < B; ++b) {
                const std::int64_t nb = cache.length(b);
                const TensorView kb = keys.slice(0, b, 1).slice(2, 0, nb);
                const TensorView vb = values.slice(0, b, 1).slice(2, 0, nb);
                // 16-bit storage: the flash kernel reads float32; converting n_b·d values is
                // small next to the block's T·n_b·d multiply-adds.
                Tensor k32, v32;
                const bool wide = cache.storage() == DType::f32;
                if (!wide) {
                    k32 = to_dtype(kb, DType::f32);
                    v32 = to_dtype(vb, DType::f32);
                }
                sdpa(Q.slice(0, b, 1), wide ? kb : k32.view(), wide ? vb : v32.view(), so, O.slice(0, b, 1));
            }
        }
    } catch (...) {
        // Leave the cache as it was: the step did not happen.
        for (std::int64_t b = 0; b < B; ++b) cache.truncate(b, old_len[static_cast<std::size_t>(b)]);
        throw;
    }

    // ---- out projection straight into the output (x_new's row order) ----
    detail::linear(o, N, E, E, layer.parameter("out_proj.weight").data_as<const float>(), E,
                   c.bias ? layer.parameter("out_proj.bias").data_as<const float>() : nullptr, output.data_as<float>(), E);
}

Tensor mha_forward_incremental(const MultiHeadAttention& layer, const TensorView& x_new, KVCache& cache,
                               MhaWorkspace* workspace) {
    check_input(layer, x_new);
    Tensor out(DType::f32, x_new.shape());
    mha_forward_incremental_into(layer, x_new, cache, out.view(), workspace);
    return out;
}

}  // namespace attn
