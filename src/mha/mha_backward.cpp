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
#include <vector>
#include <string>

#include "attn/error.hpp"
#include "attn/mha.hpp"
#include "attn/sdpa_backward.hpp"
#include "head_layout.hpp"
#include "linear.hpp"
#include "masks.hpp"

namespace attn {
namespace {

using detail::heads_view;
using detail::Rows;
using detail::rows_of;
using detail::gemm;  // thread-count independent, like the forward projections

std::string num(std::int64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& msg) { throw Error("MultiheadAttention: " + msg); }

// acc (M,) (+)= Σ over N rows of x (N, M) row stride ld.
void sum_rows(const float* x, std::int64_t N, std::int64_t M, std::int64_t ld, float* acc, bool accumulate) {
    if (!accumulate) std::memset(acc, 0, static_cast<std::size_t>(M) * sizeof(float));
    for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t m = 0; m < M; ++m) acc[m] += x[n * ld + m];
}

// A contiguous owned copy of a mask (bool stays bool, floats become float32), so the
// state never points into the caller's memory.
Tensor own_mask(const TensorView& m, const char* name) {
    if (m.data() == nullptr) fail(std::string(name) + ": data pointer is null");
    if (is_floating(m.dtype())) return to_dtype(m, DType::f32);
    if (m.dtype() != DType::boolean) {
        fail(std::string(name) + ": dtype must be bool or floating but got " + std::string(dtype_name(m.dtype())));
    }
    Tensor t(DType::boolean, m.shape());
    const auto* src = static_cast<const unsigned char*>(m.data());
    auto* dst = static_cast<unsigned char*>(t.data());
    const int r = m.rank();
    std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
    for (std::int64_t n = 0; n < m.numel(); ++n) {
        std::int64_t off = 0;
        for (int d = 0; d < r; ++d) off += idx[static_cast<std::size_t>(d)] * m.stride(d);
        dst[n] = src[off] != 0 ? 1 : 0;
        for (int d = r - 1; d >= 0; --d) {
            if (++idx[static_cast<std::size_t>(d)] < m.dim(d)) break;
            idx[static_cast<std::size_t>(d)] = 0;
        }
    }
    return t;
}

}  // namespace

Tensor MultiHeadAttention::forward_train(const TensorView& query, const TensorView& key, const TensorView& value,
                                         const MhaForwardOptions& options, const MhaTrainOptions& train,
                                         MhaForwardState& st) const {
    // query (Lq, B, E) | (B, Lq, E) | (Lq, E);  key (Lk, B, kdim) ...;  value (Lk, B, vdim) ...
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = head_dim(), Ekv = hkv * dh;
    for (const auto& [t, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}}) {
        if (t->data() == nullptr) fail(std::string(name) + ": data pointer is null");
        if (!is_floating(t->dtype())) fail(std::string(name) + ": dtype must be floating but got " + std::string(dtype_name(t->dtype())));
    }
    const Shape os = output_shape(query);  // checks query's rank
    const bool batched = query.rank() == 3;
    if (key.rank() != query.rank() || value.rank() != query.rank()) {
        fail("key and value must have the rank of query " + num(query.rank()) + " but got key " + key.shape().str() +
             ", value " + value.shape().str());
    }
    const int bd = c.batch_first ? 0 : 1, ld = batched ? (c.batch_first ? 1 : 0) : 0;
    const std::int64_t B = batched ? query.dim(bd) : 1, Lq = query.dim(ld), Lk = key.dim(ld);
    if (query.dim(query.rank() - 1) != E) fail("query: expected E = embed_dim = " + num(E) + " features but got shape " + query.shape().str());
    auto expect_kv = [&](const TensorView& t, const char* name, std::int64_t feat) {
        const Shape want = !batched ? Shape{Lk, feat} : (c.batch_first ? Shape{B, Lk, feat} : Shape{Lk, B, feat});
        if (!(t.shape() == want)) fail(std::string(name) + ": expected shape " + want.str() + " but got " + t.shape().str());
    };
    expect_kv(key, "key", c.kdim);
    expect_kv(value, "value", c.vdim);
    if (Lq < 1 || Lk < 1 || B < 1) fail("query and key must have at least one element in batch and length but got query " +
                                        query.shape().str() + ", key " + key.shape().str());
    const std::int64_t extra = (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0), Lkx = Lk + extra;
    if (extra > 0 && options.is_causal) {
        fail("is_causal: not supported together with add_bias_kv / add_zero_attn; pass a causal attn_mask (Lq, Lk) instead");
    }
    if (!(train.dropout_p >= 0.0 && train.dropout_p < 1.0)) {
        fail("dropout_p: expected 0 <= dropout_p < 1 but got " + std::to_string(train.dropout_p));
    }

    // Masks: owned copies, then PyTorch's shapes as 4-D views (stride 0 where broadcast).
    MhaForwardState s;
    std::optional<TensorView> attn4, kpm4;
    if (options.attn_mask) {
        s.mask_store[0] = own_mask(*options.attn_mask, "attn_mask");
        const TensorView m = s.mask_store[0].view();
        const Shape s2{Lq, Lk}, s3{batched ? B * h : h, Lq, Lk};
        if (m.shape() == s2) {
            attn4 = TensorView(m.data(), m.dtype(), Shape{1, 1, Lq, Lk}, Strides{0, 0, Lk, 1});
        } else if (m.shape() == s3) {
            attn4 = TensorView(m.data(), m.dtype(), Shape{B, h, Lq, Lk}, Strides{h * Lq * Lk, Lq * Lk, Lk, 1});
        } else {
            fail("attn_mask: expected shape " + s2.str() + " or " + s3.str() + " but got " + m.shape().str());
        }
    }
    if (options.key_padding_mask) {
        s.mask_store[1] = own_mask(*options.key_padding_mask, "key_padding_mask");
        const TensorView m = s.mask_store[1].view();
        const Shape want = batched ? Shape{B, Lk} : Shape{Lk};
        if (!(m.shape() == want)) fail("key_padding_mask: expected shape " + want.str() + " but got " + m.shape().str());
        kpm4 = TensorView(m.data(), m.dtype(), Shape{batched ? B : 1, 1, 1, Lk}, Strides{batched ? Lk : 0, 0, 0, 1});
    }
    if (extra > 0) {
        if (attn4) attn4 = (s.mask_store[0] = detail::pad_keys(*attn4, Lkx)).view();
        if (kpm4) kpm4 = (s.mask_store[1] = detail::pad_keys(*kpm4, Lkx)).view();
    }
    detail::SdpaMasks masks = detail::to_sdpa_masks(attn4, kpm4);
    s.mask_store[2] = std::move(masks.keep_store);
    s.mask_store[3] = std::move(masks.add_store);
    s.sdpa.impl = options.impl;
    s.sdpa.causal = options.is_causal ? Causal::top_left : Causal::none;
    s.sdpa.bool_mask = masks.keep;  // views into s.mask_store (moving a Tensor keeps its data)
    s.sdpa.additive_mask = masks.add;
    s.sdpa.dropout_p = train.dropout_p;
    s.sdpa.dropout_seed = train.dropout_seed;

    s.query_shape = query.shape();
    s.key_shape = key.shape();
    s.value_shape = value.shape();
    s.B = B, s.Lq = Lq, s.Lk = Lk, s.Lkx = Lkx, s.batched = batched;
    s.x[0] = to_dtype(query, DType::f32);
    s.x[1] = to_dtype(key, DType::f32);
    s.x[2] = to_dtype(value, DType::f32);

    // Projections.
    const Rows rq = rows_of(batched, c.batch_first, B, Lq), rk = rows_of(batched, c.batch_first, B, Lk);
    const std::int64_t Nq = B * Lq;
    const bool packed = c.kdim == E && c.vdim == E;
    const float* bias = c.bias ? parameter("in_proj_bias").data_as<const float>() : nullptr;
    const float* wq = packed ? parameter("in_proj_weight").data_as<const float>() : parameter("q_proj_weight").data_as<const float>();
    const float* wk = packed ? wq + E * E : parameter("k_proj_weight").data_as<const float>();
    const float* wv = packed ? wk + Ekv * E : parameter("v_proj_weight").data_as<const float>();
    const float *bq = bias, *bk = bias ? bias + E : nullptr, *bv = bias ? bias + E + Ekv : nullptr;
    s.q = Tensor(DType::f32, Shape{Nq, E});
    detail::linear(s.x[0].data_as<const float>(), Nq, E, E, wq, E, bq, s.q.data_as<float>(), E);
    s.k = Tensor(DType::f32, Shape{B * Lkx, Ekv});
    s.v = Tensor(DType::f32, Shape{B * Lkx, Ekv});
    float *k = s.k.data_as<float>(), *v = s.v.data_as<float>();
    const float *xk = s.x[1].data_as<const float>(), *xv = s.x[2].data_as<const float>();
    for (std::int64_t b = 0; b < B; ++b) {
        detail::linear(xk + b * rk.rb * c.kdim, Lk, c.kdim, rk.rl * c.kdim, wk, Ekv, bk, k + b * Lkx * Ekv, Ekv);
        detail::linear(xv + b * rk.rb * c.vdim, Lk, c.vdim, rk.rl * c.vdim, wv, Ekv, bv, v + b * Lkx * Ekv, Ekv);
        std::int64_t row = b * Lkx + Lk;
        const std::size_t bytes = static_cast<std::size_t>(Ekv) * sizeof(float);
        if (c.add_bias_kv) {
            std::memcpy(k + row * Ekv, parameter("bias_k").data(), bytes);
            std::memcpy(v + row * Ekv, parameter("bias_v").data(), bytes);
            ++row;
        }
        if (c.add_zero_attn) {
            std::memset(k + row * Ekv, 0, bytes);
            std::memset(v + row * Ekv, 0, bytes);
        }
    }

    // Attention, O in the query's row order (heads concatenated), lse kept.
    s.attn_out = Tensor(DType::f32, Shape{Nq, E});
    s.lse = Tensor(DType::f32, Shape{B, h, Lq});
    const Rows rkx{Lkx, 1};
    const TensorView lse = s.lse.view();
    sdpa(heads_view(s.q.data_as<float>(), E, 0, rq, B, h, Lq, dh), heads_view(k, Ekv, 0, rkx, B, hkv, Lkx, dh),
         heads_view(v, Ekv, 0, rkx, B, hkv, Lkx, dh), s.sdpa, heads_view(s.attn_out.data_as<float>(), E, 0, rq, B, h, Lq, dh),
         &lse);

    Tensor out(DType::f32, os);
    detail::linear(s.attn_out.data_as<const float>(), Nq, E, E, parameter("out_proj.weight").data_as<const float>(), E,
                   c.bias ? parameter("out_proj.bias").data_as<const float>() : nullptr, out.data_as<float>(), E);
    st = std::move(s);
    return out;
}

MhaGradients MultiHeadAttention::backward(const MhaForwardState& s, const TensorView& grad_output) const {
    // grad_output like the output (Lq, B, E) | (B, Lq, E) | (Lq, E)
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = head_dim(), Ekv = hkv * dh;
    if (s.q.data() == nullptr || s.q.shape()[1] != E || s.k.shape()[1] != Ekv) {
        fail("backward: the state was not filled by forward_train of this layer");
    }
    const Shape want = s.query_shape.rank == 3 ? Shape{s.query_shape[0], s.query_shape[1], E} : Shape{s.query_shape[0], E};
    if (grad_output.data() == nullptr || !is_floating(grad_output.dtype()) || !(grad_output.shape() == want)) {
        fail("grad_output: expected a floating tensor shaped like the output " + want.str() + " but got " +
             std::string(dtype_name(grad_output.dtype())) + " " + grad_output.shape().str());
    }
    const std::int64_t B = s.B, Lq = s.Lq, Lk = s.Lk, Lkx = s.Lkx, Nq = B * Lq;
    const Rows rq = rows_of(s.batched, c.batch_first, B, Lq), rk = rows_of(s.batched, c.batch_first, B, Lk);
    const bool packed = c.kdim == E && c.vdim == E;
    const float* wq = packed ? parameter("in_proj_weight").data_as<const float>() : parameter("q_proj_weight").data_as<const float>();
    const float* wk = packed ? wq + E * E : parameter("k_proj_weight").data_as<const float>();
    const float* wv = packed ? wk + Ekv * E : parameter("v_proj_weight").data_as<const float>();
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
    sdpa_backward(heads_view(s.q.data_as<float>(), E, 0, rq, B, h, Lq, dh), heads_view(s.k.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh),
                  heads_view(s.v.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh),
                  heads_view(s.attn_out.data_as<float>(), E, 0, rq, B, h, Lq, dh), s.lse.view(),
                  heads_view(d_o.data_as<float>(), E, 0, rq, B, h, Lq, dh), s.sdpa,
                  heads_view(dq.data_as<float>(), E, 0, rq, B, h, Lq, dh), heads_view(dk.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh),
                  heads_view(dv.data_as<float>(), Ekv, 0, rkx, B, hkv, Lkx, dh));

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
