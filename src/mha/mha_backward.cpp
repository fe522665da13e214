// MultiHeadAttention training: forward_train (saves Q, K, V, O, lse) and backward.
//
//   forward:  Q = Xq·W_Qᵀ + b_Q, K = [Xk·W_Kᵀ + b_K; bias_k; 0], V likewise   (sgemm)
//             O = dropout(softmax(Q·Kᵀ/√d_h + masks))·V                       (attn::sdpa)
//             Y = O·W_Oᵀ + b_O                                                (sgemm)
//   backward: dW_O = dYᵀ·O, db_O = Σrows dY, dO = dY·W_O                      (sgemm)
//             dQ, dK, dV = attn::sdpa_backward(...)                           (same options)
//             dW_Q = dQᵀ·Xq, db_Q = Σrows dQ, dXq = dQ·W_Q  (K, V per batch item; the
//             appended bias_k/bias_v rows give their gradients, the zero rows none)
// K and V always live in batch-major (B·Lkx, E_kv) buffers here (one GEMM per batch item),
// which covers add_bias_kv / add_zero_attn and every input layout with one code path.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../core/check.hpp"
#include "attn/mha.hpp"
#include "attn/sdpa_backward.hpp"
#include "head_layout.hpp"
#include "inputs.hpp"
#include "linear.hpp"
#include "masks.hpp"
#include "packed_backward.hpp"
#include "projection.hpp"
#include "train_state.hpp"
#include "../core/threads.hpp"

namespace attn {
namespace {

using detail::heads_view;
using detail::Rows;
using detail::rows_of;
using detail::fail;
using detail::fail_type;
using detail::kMha;
using detail::gemm;  // thread-count independent, like the forward projections
using detail::sum_rows;

}  // namespace

namespace detail {

void own_score_modifiers(MhaForwardState& s) {
    if (s.sdpa.alibi_slopes) {
        s.alibi = to_dtype(*s.sdpa.alibi_slopes, DType::f32);
        s.sdpa.alibi_slopes = s.alibi.view();
    }
    if (s.sdpa.sinks) {
        s.sinks = to_dtype(*s.sdpa.sinks, DType::f32);
        s.sdpa.sinks = s.sinks.view();
    }
}

}  // namespace detail

Tensor MultiHeadAttention::forward_train(const TensorView& query, const TensorView& key, const TensorView& value,
                                         const MhaForwardOptions& options, const MhaTrainOptions& train,
                                         MhaForwardState& st) const {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, h = c.num_heads, dh = head_dim();
    if (c.param_dtype != DType::f32) {
        fail_type(kMha, "forward_train: the weight matrices are stored in ", dtype_name(c.param_dtype),
             "; training needs float32 parameters (set_param_dtype(float32) first; the gradient GEMMs read float32 weights)");
    }
    const detail::MhaShapes sh = detail::check_inputs(c, query, key, value, options);
    const DType out_dtype = detail::output_dtype(options.out_dtype, query.dtype());  // forward()'s rule
    if (detail::intermediate_dtype(options.intermediate_dtype) != DType::f32) {
        fail_type(kMha, "intermediate_dtype: forward_train keeps float32 intermediates (backward reads them) but got ",
             dtype_name(*options.intermediate_dtype));
    }
    detail::require_dropout(kMha, train.dropout_p, train.dropout_seed);
    detail::PytorchMasks pt = detail::pytorch_masks_4d(options.attn_mask, options.key_padding_mask, sh.batched, sh.B, h, sh.Lq, sh.Lk);

    // Masks: owned copies (the state must outlive the caller's tensors), with the appended
    // keys allowed. The saved SdpaOptions point into s.mask_store (moving keeps the data).
    MhaForwardState s;
    detail::pad_masks(pt, sh.Lkx);
    detail::SdpaMasks masks = detail::to_sdpa_masks(pt.attn, pt.kpm);
    s.mask_store[0] = std::move(pt.attn_store);
    s.mask_store[1] = std::move(pt.kpm_store);
    s.mask_store[2] = std::move(masks.keep_store);
    s.mask_store[3] = std::move(masks.add_store);
    s.sdpa.impl = options.impl;
    s.sdpa.causal = options.causal;  // the backward reads it from the state
    s.sdpa.bool_mask = masks.keep;
    s.sdpa.additive_mask = masks.add;
    s.sdpa.dropout_p = train.dropout_p;
    s.sdpa.dropout_seed = train.dropout_seed;
    // Score modifiers: owned copies, like the masks.
    score_modifiers(s.sdpa);
    detail::own_score_modifiers(s);

    s.layer = c;
    s.query_shape = query.shape();
    s.key_shape = key.shape();
    s.value_shape = value.shape();
    s.B = sh.B, s.Lq = sh.Lq, s.Lk = sh.Lk, s.Lkx = sh.Lkx, s.batched = sh.batched;
    for (int i = 0; i < 3; ++i) s.x[i] = to_dtype(i == 0 ? query : i == 1 ? key : value, DType::f32);

    // Projections: K and V batch-major with the appended rows — the layout backward reads.
    MhaWorkspace ws;
    const detail::Projected p = detail::project_qkv(*this, sh, s.x[0].data_as<const float>(), s.x[1].data_as<const float>(),
                                                    s.x[2].data_as<const float>(), {.batch_major = true}, ws);
    // (the saved inputs are float32 copies: the backward's weight-gradient GEMMs read them)
    s.q = std::move(ws.proj_q);
    s.k = std::move(ws.proj_kv);
    s.v = std::move(ws.proj_v);

    // Attention, O in the query's row order (heads concatenated), lse kept.
    const std::int64_t Nq = sh.B * sh.Lq;
    s.attn_out = Tensor(DType::f32, Shape{Nq, E});
    s.lse = Tensor(DType::f32, Shape{sh.B, h, sh.Lq});
    const TensorView lse = s.lse.view();
    sdpa(p.Q, p.K, p.V, s.sdpa, heads_view(s.attn_out.data_as<float>(), E, 0, sh.rq, sh.B, h, sh.Lq, dh), &lse);

    Tensor out(DType::f32, output_shape(query));
    detail::linear(s.attn_out.data_as<const float>(), Nq, E, E, parameter("out_proj.weight").data_as<const float>(), E,
                   c.bias ? parameter("out_proj.bias").data_as<const float>() : nullptr, out.data_as<float>(), E);
    st = std::move(s);
    // The output in forward()'s dtype: the float32 result rounded once (the state keeps float32).
    if (out_dtype == DType::f32) return out;
    return to_dtype(out.view(), out_dtype);
}

MhaGradients MultiHeadAttention::backward(const MhaForwardState& s, const TensorView& grad_output) const {
    const MhaConfig& c = config_;
    if (c.param_dtype != DType::f32) {
        fail_type(kMha, "backward: the weight matrices are stored in ", dtype_name(c.param_dtype), "; training needs float32 parameters");
    }
    if (s.cu_seqlens_q.data() != nullptr) return detail::packed_backward(*this, s, grad_output);  // forward_packed_train
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    // grad_output like the output (Lq, B, E) | (B, Lq, E) | (Lq, E)
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = head_dim(), Ekv = hkv * dh;
    detail::check_train_state(*this, s);
    const Shape want = s.query_shape.rank == 3 ? Shape{s.query_shape[0], s.query_shape[1], E} : Shape{s.query_shape[0], E};
    if (grad_output.data() == nullptr || !is_floating(grad_output.dtype()) || !(grad_output.shape() == want)) {
        const bool dtype_ok = grad_output.data() == nullptr || is_floating(grad_output.dtype());
        detail::fail_as(dtype_ok ? ErrorKind::value : ErrorKind::type, kMha,
                        "grad_output: expected a floating tensor shaped like the output ", want, " but got ",
                        dtype_name(grad_output.dtype()), " ", grad_output.shape());
    }
    const std::int64_t B = s.B, Lq = s.Lq, Lk = s.Lk, Lkx = s.Lkx, Nq = B * Lq;
    const Rows rq = rows_of(s.batched, c.batch_first, B, Lq), rk = rows_of(s.batched, c.batch_first, B, Lk);
    const detail::InputWeights w_in = detail::input_weights(*this);
    const bool packed = w_in.packed;
    // float32 (checked above)
    const float *wq = static_cast<const float*>(w_in.wq.data), *wk = static_cast<const float*>(w_in.wk.data),
                *wv = static_cast<const float*>(w_in.wv.data);
    const float* wo = parameter("out_proj.weight").data_as<const float>();

    MhaGradients g;
    std::map<std::string, Tensor> pg;
    for (const auto& [name, shape] : parameter_shapes()) pg.emplace(name, Tensor(DType::f32, shape, true));
    const Tensor dy = to_dtype(grad_output, DType::f32);
    const float* dyp = dy.data_as<const float>();

    // Out projection: dW_O (E, E) = dYᵀ·O, db_O = Σ dY, dO (Nq, E) = dY·W_O.
    gemm(true, false, E, E, Nq, dyp, E, s.attn_out.data_as<const float>(), E, 0.0f, pg.at("out_proj.weight").data_as<float>(), E);
    if (c.bias) sum_rows(dyp, Nq, E, E, pg.at("out_proj.bias").data_as<float>(), false);
    Tensor d_o(DType::f32, Shape{Nq, E});
    gemm(false, false, Nq, E, E, dyp, E, wo, E, 0.0f, d_o.data_as<float>(), E);

    // Attention.
    Tensor dq(DType::f32, Shape{Nq, E}), dk(DType::f32, Shape{B * Lkx, Ekv}), dv(DType::f32, Shape{B * Lkx, Ekv});
    const Rows rkx{Lkx, 1};
    const TensorView dsinks = c.sinks ? pg.at("sinks").view() : TensorView();  // ∂loss/∂σ_h
    sdpa_backward(heads_view(s.q.data_as<float>(), E, 0, rq, B, h, Lq, dh), heads_view(s.k.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh),
                  heads_view(s.v.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh),
                  heads_view(s.attn_out.data_as<float>(), E, 0, rq, B, h, Lq, dh), s.lse.view(),
                  heads_view(d_o.data_as<float>(), E, 0, rq, B, h, Lq, dh), s.sdpa,
                  heads_view(dq.data_as<float>(), E, 0, rq, B, h, Lq, dh), heads_view(dk.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh),
                  heads_view(dv.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh), nullptr, c.sinks ? &dsinks : nullptr);

    // Input projections. dW for packed weights are row blocks of in_proj_weight.
    float* dwq = packed ? pg.at("in_proj_weight").data_as<float>() : pg.at("q_proj_weight").data_as<float>();
    float* dwk = packed ? dwq + E * E : pg.at("k_proj_weight").data_as<float>();
    float* dwv = packed ? dwk + Ekv * E : pg.at("v_proj_weight").data_as<float>();
    float* dbias = c.bias ? pg.at("in_proj_bias").data_as<float>() : nullptr;
    g.query = Tensor(DType::f32, s.query_shape);
    g.key = Tensor(DType::f32, s.key_shape);
    g.value = Tensor(DType::f32, s.value_shape);
    gemm(true, false, E, E, Nq, dq.data_as<const float>(), E, s.x[0].data_as<const float>(), E, 0.0f, dwq, E);
    gemm(false, false, Nq, E, E, dq.data_as<const float>(), E, wq, E, 0.0f, g.query.data_as<float>(), E);
    if (dbias) sum_rows(dq.data_as<const float>(), Nq, E, E, dbias, false);
    for (int which = 0; which < 2; ++which) {
        const std::int64_t F = which == 0 ? c.kdim : c.vdim;
        const float* dkv = (which == 0 ? dk : dv).data_as<const float>();
        const float* x = s.x[1 + which].data_as<const float>();
        const float* w = which == 0 ? wk : wv;
        float* dw = which == 0 ? dwk : dwv;
        float* dx = (which == 0 ? g.key : g.value).data_as<float>();
        for (std::int64_t b = 0; b < B; ++b) {
            // rows of item b: dK_b (Lk, E_kv) contiguous; X_b (Lk, F) row stride rl·F.
            const float* db = dkv + b * Lkx * Ekv;
            gemm(true, false, Ekv, F, Lk, db, Ekv, x + b * rk.rb * F, rk.rl * F, b == 0 ? 0.0f : 1.0f, dw, F);
            gemm(false, false, Lk, F, Ekv, db, Ekv, w, F, 0.0f, dx + b * rk.rb * F, rk.rl * F);
            if (dbias) sum_rows(db, Lk, Ekv, Ekv, dbias + E + which * Ekv, b > 0);
            if (c.add_bias_kv) {
                float* dbkv = pg.at(which == 0 ? "bias_k" : "bias_v").data_as<float>();
                sum_rows(db + Lk * Ekv, 1, Ekv, Ekv, dbkv, true);
            }
        }
    }
    for (const auto& [name, shape] : parameter_shapes()) g.params.emplace_back(name, std::move(pg.at(name)));
    return g;
}

}  // namespace attn
