// MultiHeadAttention::forward_packed: the layer on packed variable-length input. The three
// projections and out_proj are row-wise (linear.hpp), so they run on the packed rows as they
// are; between them attn::sdpa_varlen attends within each sequence, its heads seen through
// stride views of the projected rows ((T, E) as (T, h, d_h)) — no padding, no copy.
#include <cmath>

#include "attn/mha.hpp"
#include "attn/sdpa_varlen.hpp"
#include "../core/check.hpp"
#include "linear.hpp"
#include "projection.hpp"

namespace attn {
namespace {

constexpr std::string_view kOp = "MultiHeadAttention.forward_packed";

}  // namespace

Tensor MultiHeadAttention::forward_packed(const TensorView& query, const TensorView& key, const TensorView& value,
                                          const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                          const MhaPackedOptions& options) const {
    const MhaConfig& c = config_;
    if (c.add_bias_kv || c.add_zero_attn) {
        detail::fail(kOp, "add_bias_kv / add_zero_attn: not supported for packed input (they append keys per sequence)");
    }
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = head_dim(), Ekv = hkv * dh;
    detail::require_rank(kOp, query, "query", 2, "(Tq, E)");
    detail::require_rank(kOp, key, "key", 2, "(Tk, kdim)");
    detail::require_rank(kOp, value, "value", 2, "(Tk, vdim)");
    if (query.dim(1) != E) detail::fail(kOp, "query: expected ", E, " features (embed_dim) but got ", query.dim(1));
    if (key.dim(1) != c.kdim) detail::fail(kOp, "key: expected ", c.kdim, " features (kdim) but got ", key.dim(1));
    if (value.dim(1) != c.vdim) detail::fail(kOp, "value: expected ", c.vdim, " features (vdim) but got ", value.dim(1));
    if (value.dim(0) != key.dim(0)) {
        detail::fail(kOp, "value: has ", value.dim(0), " tokens but key has ", key.dim(0));
    }
    const std::int64_t Tq = query.dim(0), Tk = key.dim(0);

    Tensor copies[3];
    const detail::Operand xq = detail::as_rows(query, copies[0]);
    const detail::Operand xk = detail::as_rows(key, copies[1]);
    const detail::Operand xv = detail::as_rows(value, copies[2]);
    const detail::InputWeights w = detail::input_weights(*this);
    Tensor q(DType::f32, Shape{Tq, E}), k(DType::f32, Shape{Tk, Ekv}), v(DType::f32, Shape{Tk, Ekv});
    detail::linear(xq, Tq, E, E, w.wq, E, w.bq, q.data_as<float>(), E);
    detail::linear(xk, Tk, c.kdim, c.kdim, w.wk, Ekv, w.bk, k.data_as<float>(), Ekv);
    detail::linear(xv, Tk, c.vdim, c.vdim, w.wv, Ekv, w.bv, v.data_as<float>(), Ekv);

    // (T, E) rows as (T, heads, d_h): head j is columns j·d_h .. j·d_h + d_h − 1.
    auto heads = [&](const Tensor& t, std::int64_t H) {
        return TensorView(t.data(), DType::f32, Shape{t.shape()[0], H, dh}, Strides{H * dh, dh, 1});
    };
    Tensor attn_out(DType::f32, Shape{Tq, E});
    SdpaOptions o;
    o.causal = options.causal;
    o.impl = options.impl;  // scale: sdpa's default 1/√d_h, as the layer's
    sdpa_varlen(heads(q, h), heads(k, hkv), heads(v, hkv), cu_seqlens_q, cu_seqlens_k, o, heads(attn_out, h));

    Tensor out(DType::f32, Shape{Tq, E});
    const float* ob = c.bias ? parameter("out_proj.bias").data_as<const float>() : nullptr;
    detail::linear(attn_out.data_as<const float>(), Tq, E, E, detail::out_weight(*this), E, ob, out.data_as<float>(), E);
    const DType out_dtype = detail::output_dtype(std::nullopt, query.dtype());
    if (out_dtype == DType::f32) return out;
    Tensor narrow(out_dtype, Shape{Tq, E});
    detail::store_output(out.data_as<const float>(), narrow.view());
    return narrow;
}

}  // namespace attn
