#include "projection.hpp"

#include <cstring>

#include "linear.hpp"

namespace attn::detail {

float* ensure(Tensor& t, const Shape& shape) {
    if (t.data() == nullptr || t.dtype() != DType::f32 || !(t.shape() == shape)) t = Tensor(DType::f32, shape);
    return t.data_as<float>();
}

const float* as_rows(const TensorView& x, Tensor& copy) {
    if (x.dtype() == DType::f32 && x.is_contiguous()) return x.data_as<const float>();
    copy = to_dtype(x, DType::f32);
    return copy.data_as<const float>();
}

InputWeights input_weights(const MultiHeadAttention& layer) {
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim, Ekv = c.num_kv_heads * layer.head_dim();
    auto p = [&](const char* name) { return layer.parameter(name).data_as<const float>(); };
    InputWeights w;
    w.packed = c.kdim == E && c.vdim == E;  // in_proj_weight holds W_Q, W_K, W_V
    w.wq = w.packed ? p("in_proj_weight") : p("q_proj_weight");
    w.wk = w.packed ? w.wq + E * E : p("k_proj_weight");
    w.wv = w.packed ? w.wk + Ekv * E : p("v_proj_weight");
    if (c.bias) {
        w.bias = w.bq = p("in_proj_bias");
        w.bk = w.bias + E;
        w.bv = w.bias + E + Ekv;
    }
    return w;
}

Projected project_qkv(const MultiHeadAttention& layer, const MhaShapes& s, const float* xq, const float* xk,
                      const float* xv, ProjectionPlan plan, MhaWorkspace& ws) {
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = layer.head_dim(), Ekv = hkv * dh;
    const std::int64_t B = s.B, Lq = s.Lq, Lk = s.Lk, Lkx = s.Lkx, Nq = B * Lq, Nk = B * Lk;
    const InputWeights w = input_weights(layer);
    Projected p;
    if (plan.self_attention && w.packed && !plan.batch_major) {
        // One GEMM X (N, E) · [W_Q; W_K; W_V]ᵀ → (N, E + 2·E_kv), i.e. per row (3, h, d_h)
        // without GQA; Q, K and V are strided views of it.
        const std::int64_t n = E + 2 * Ekv;
        float* qkv = ensure(ws.proj_q, Shape{Nq, n});
        linear(xq, Nq, E, E, w.wq, n, w.bias, qkv, n);
        p.Q = heads_view(qkv, n, 0, s.rq, B, h, Lq, dh);
        p.K = heads_view(qkv, n, E, s.rk, B, hkv, Lk, dh);
        p.V = heads_view(qkv, n, E + Ekv, s.rk, B, hkv, Lk, dh);
        return p;
    }
    float* q = ensure(ws.proj_q, Shape{Nq, E});
    linear(xq, Nq, E, E, w.wq, E, w.bq, q, E);
    p.Q = heads_view(q, E, 0, s.rq, B, h, Lq, dh);
    if (plan.batch_major) {
        // One GEMM per batch item into (B, Lkx, E_kv) buffers, then the appended rows.
        // Rows of item b in the input: b·rb + l·rl.
        float* k = ensure(ws.proj_kv, Shape{B * Lkx, Ekv});
        float* v = ensure(ws.proj_v, Shape{B * Lkx, Ekv});
        const float* bias_k = c.add_bias_kv ? layer.parameter("bias_k").data_as<const float>() : nullptr;
        const float* bias_v = c.add_bias_kv ? layer.parameter("bias_v").data_as<const float>() : nullptr;
        const std::size_t bytes = static_cast<std::size_t>(Ekv) * sizeof(float);
        for (std::int64_t b = 0; b < B; ++b) {
            linear(xk + b * s.rk.rb * c.kdim, Lk, c.kdim, s.rk.rl * c.kdim, w.wk, Ekv, w.bk, k + b * Lkx * Ekv, Ekv);
            linear(xv + b * s.rk.rb * c.vdim, Lk, c.vdim, s.rk.rl * c.vdim, w.wv, Ekv, w.bv, v + b * Lkx * Ekv, Ekv);
            std::int64_t row = b * Lkx + Lk;
            if (c.add_bias_kv) {
                std::memcpy(k + row * Ekv, bias_k, bytes);
                std::memcpy(v + row * Ekv, bias_v, bytes);
                ++row;
            }
            if (c.add_zero_attn) {
                std::memset(k + row * Ekv, 0, bytes);
                std::memset(v + row * Ekv, 0, bytes);
            }
        }
        const Rows rkx{Lkx, 1};
        p.K = heads_view(k, Ekv, 0, rkx, B, hkv, Lkx, dh);
        p.V = heads_view(v, Ekv, 0, rkx, B, hkv, Lkx, dh);
    } else if (plan.shared_kv && w.packed) {
        // Cross-attention on one memory tensor: one GEMM for K and V.
        float* kv = ensure(ws.proj_kv, Shape{Nk, 2 * Ekv});
        linear(xk, Nk, E, E, w.wk, 2 * Ekv, w.bk, kv, 2 * Ekv);
        p.K = heads_view(kv, 2 * Ekv, 0, s.rk, B, hkv, Lk, dh);
        p.V = heads_view(kv, 2 * Ekv, Ekv, s.rk, B, hkv, Lk, dh);
    } else {
        float* k = ensure(ws.proj_kv, Shape{Nk, Ekv});
        float* v = ensure(ws.proj_v, Shape{Nk, Ekv});
        linear(xk, Nk, c.kdim, c.kdim, w.wk, Ekv, w.bk, k, Ekv);
        linear(xv, Nk, c.vdim, c.vdim, w.wv, Ekv, w.bv, v, Ekv);
        p.K = heads_view(k, Ekv, 0, s.rk, B, hkv, Lk, dh);
        p.V = heads_view(v, Ekv, 0, s.rk, B, hkv, Lk, dh);
    }
    return p;
}

}  // namespace attn::detail
