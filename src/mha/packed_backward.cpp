// MultiHeadAttention backward for packed input (forward_packed_train). Every step but the
// attention is row-wise, so it is the batched backward (mha_backward.cpp) on the packed rows:
//   dW_O = dYᵀ·O, db_O = Σ dY, dO = dY·W_O
//   dQ, dK, dV = attn::sdpa_varlen_backward(...)   (per sequence, the saved options)
//   dW_Q = dQᵀ·Xq, db_Q = Σ dQ, dXq = dQ·W_Q  (and K, V likewise over all Tk rows)
#include "packed_backward.hpp"

#include <map>
#include <string>

#include "../core/check.hpp"
#include "../core/threads.hpp"
#include "attn/sdpa_varlen.hpp"
#include "inputs.hpp"
#include "linear.hpp"
#include "projection.hpp"
#include "train_state.hpp"

namespace attn::detail {

MhaGradients packed_backward(const MultiHeadAttention& layer, const MhaForwardState& s, const TensorView& grad_output) {
    const ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = layer.head_dim(), Ekv = hkv * dh;
    check_train_state(layer, s);
    const std::int64_t Tq = s.q.shape()[0], Tk = s.k.shape()[0];
    const Shape want{Tq, E};
    if (grad_output.data() == nullptr || !is_floating(grad_output.dtype()) || !(grad_output.shape() == want)) {
        const bool dtype_ok = grad_output.data() == nullptr || is_floating(grad_output.dtype());
        fail_as(dtype_ok ? ErrorKind::value : ErrorKind::type, kMha,
                "grad_output: expected a floating tensor shaped like the packed output ", want, " but got ",
                dtype_name(grad_output.dtype()), " ", grad_output.shape());
    }
    const InputWeights w = input_weights(layer);
    const float* wo = layer.parameter("out_proj.weight").data_as<const float>();

    MhaGradients g;
    std::map<std::string, Tensor> pg;
    for (const auto& [name, shape] : layer.parameter_shapes()) pg.emplace(name, Tensor(DType::f32, shape, true));
    const Tensor dy = to_dtype(grad_output, DType::f32);
    const float* dyp = dy.data_as<const float>();

    gemm(true, false, E, E, Tq, dyp, E, s.attn_out.data_as<const float>(), E, 0.0f,
         pg.at("out_proj.weight").data_as<float>(), E);
    if (c.bias) sum_rows(dyp, Tq, E, E, pg.at("out_proj.bias").data_as<float>(), false);
    Tensor d_o(DType::f32, Shape{Tq, E});
    gemm(false, false, Tq, E, E, dyp, E, wo, E, 0.0f, d_o.data_as<float>(), E);

    Tensor dq(DType::f32, Shape{Tq, E}), dk(DType::f32, Shape{Tk, Ekv}), dv(DType::f32, Shape{Tk, Ekv});
    const TensorView dsinks = c.sinks ? pg.at("sinks").view() : TensorView();  // ∂loss/∂σ_h
    sdpa_varlen_backward(packed_heads(s.q, h, dh), packed_heads(s.k, hkv, dh), packed_heads(s.v, hkv, dh),
                         s.cu_seqlens_q, s.cu_seqlens_k, packed_heads(s.attn_out, h, dh), s.lse,
                         packed_heads(d_o, h, dh), s.sdpa, packed_heads(dq, h, dh), packed_heads(dk, hkv, dh),
                         packed_heads(dv, hkv, dh), nullptr, c.sinks ? &dsinks : nullptr);

    // Input projections; with packed weights dW_Q, dW_K, dW_V are row blocks of in_proj_weight.
    float* dwq = w.packed ? pg.at("in_proj_weight").data_as<float>() : pg.at("q_proj_weight").data_as<float>();
    float* dwk = w.packed ? dwq + E * E : pg.at("k_proj_weight").data_as<float>();
    float* dwv = w.packed ? dwk + Ekv * E : pg.at("v_proj_weight").data_as<float>();
    float* dbias = c.bias ? pg.at("in_proj_bias").data_as<float>() : nullptr;
    g.query = Tensor(DType::f32, s.query_shape);
    g.key = Tensor(DType::f32, s.key_shape);
    g.value = Tensor(DType::f32, s.value_shape);
    struct Part {
        const Tensor& d;
        const Tensor& x;
        const float* w;
        std::int64_t T, out, in;
        float* dw;
        Tensor& dx;
        float* db;
    };
    // Training holds float32 weights (backward() checks param_dtype before this runs).
    const auto f32 = [](const Operand& o) {
        ATTN_DASSERT(o.dtype == DType::f32);
        return static_cast<const float*>(o.data);
    };
    const Part parts[3] = {
        {dq, s.x[0], f32(w.wq), Tq, E, E, dwq, g.query, dbias},
        {dk, s.x[1], f32(w.wk), Tk, Ekv, c.kdim, dwk, g.key, dbias ? dbias + E : nullptr},
        {dv, s.x[2], f32(w.wv), Tk, Ekv, c.vdim, dwv, g.value, dbias ? dbias + E + Ekv : nullptr},
    };
    for (const Part& p : parts) {
        const float* d = p.d.data_as<const float>();
        gemm(true, false, p.out, p.in, p.T, d, p.out, p.x.data_as<const float>(), p.in, 0.0f, p.dw, p.in);
        gemm(false, false, p.T, p.in, p.out, d, p.out, p.w, p.in, 0.0f, p.dx.data_as<float>(), p.in);
        if (p.db) sum_rows(d, p.T, p.out, p.out, p.db, false);
    }
    for (const auto& [name, shape] : layer.parameter_shapes()) g.params.emplace_back(name, std::move(pg.at(name)));
    return g;
}

}  // namespace attn::detail
