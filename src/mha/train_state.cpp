// What MultiHeadAttention::backward checks of an MhaForwardState: train_state.hpp.
#include "train_state.hpp"

#include "../core/check.hpp"
#include "inputs.hpp"

namespace attn::detail {
namespace {

void expect(const char* what, const Tensor& t, DType dtype, const Shape& want) {
    if (t.data() == nullptr || t.dtype() != dtype || !(t.shape() == want)) {
        fail(kMha, "backward: the state's ", what, " must be ", dtype_name(dtype), " ", want, " but is ",
             t.data() == nullptr ? "empty" : dtype_name(t.dtype()), t.data() == nullptr ? "" : " ",
             t.data() == nullptr ? Shape{} : t.shape(), " (fill the state with forward_train or forward_packed_train of this layer)");
    }
}

template <class T>
void same(const char* name, const T& state_value, const T& layer_value) {
    if (state_value == layer_value) return;
    if constexpr (std::is_same_v<T, bool>) {
        fail(kMha, "backward: the state was filled by a layer with ", name, " = ", state_value ? "true" : "false",
             " but this layer has ", name, " = ", layer_value ? "true" : "false");
    } else {
        fail(kMha, "backward: the state was filled by a layer with ", name, " = ", state_value, " but this layer has ",
             name, " = ", layer_value);
    }
}

// The input shape forward_train saw for L rows per batch item of F features.
Shape input_shape(const MhaConfig& c, bool batched, std::int64_t B, std::int64_t L, std::int64_t F) {
    if (!batched) return Shape{L, F};
    return c.batch_first ? Shape{B, L, F} : Shape{L, B, F};
}

}  // namespace

void check_train_state(const MultiHeadAttention& layer, const MhaForwardState& s) {
    const MhaConfig& c = layer.config();
    if (s.q.data() == nullptr) {
        fail(kMha, "backward: the state is empty (fill it with forward_train or forward_packed_train of this layer first)");
    }
    const MhaConfig& f = s.layer;
    same("embed_dim", f.embed_dim, c.embed_dim);
    same("num_heads", f.num_heads, c.num_heads);
    same("num_kv_heads", f.num_kv_heads, c.num_kv_heads);
    same("kdim", f.kdim, c.kdim);
    same("vdim", f.vdim, c.vdim);
    same("bias", f.bias, c.bias);
    same("batch_first", f.batch_first, c.batch_first);
    same("add_bias_kv", f.add_bias_kv, c.add_bias_kv);
    same("add_zero_attn", f.add_zero_attn, c.add_zero_attn);
    same("sinks", f.sinks, c.sinks);
    const std::int64_t E = c.embed_dim, h = c.num_heads, Ekv = c.num_kv_heads * layer.head_dim();
    if (s.cu_seqlens_q.data() != nullptr) {  // forward_packed_train: rows (T, ·); sdpa_varlen_backward checks the offsets
        const std::int64_t Tq = s.q.shape()[0], Tk = s.k.shape().rank > 0 ? s.k.shape()[0] : 0;
        expect("query copy", s.x[0], DType::f32, Shape{Tq, E});
        expect("key copy", s.x[1], DType::f32, Shape{Tk, c.kdim});
        expect("value copy", s.x[2], DType::f32, Shape{Tk, c.vdim});
        expect("q", s.q, DType::f32, Shape{Tq, E});
        expect("k", s.k, DType::f32, Shape{Tk, Ekv});
        expect("v", s.v, DType::f32, Shape{Tk, Ekv});
        expect("attn_out", s.attn_out, DType::f32, Shape{Tq, E});
        expect("lse", s.lse, DType::f32, Shape{Tq, h});
        return;
    }
    const std::int64_t extra = (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
    if (s.B < 1 || s.Lq < 1 || s.Lk < 0 || s.Lkx != s.Lk + extra || (!s.batched && s.B != 1)) {
        fail(kMha, "backward: the state's sizes B = ", s.B, ", Lq = ", s.Lq, ", Lk = ", s.Lk, ", Lkx = ", s.Lkx,
             " are not what forward_train of this layer records (Lkx = Lk + ", extra, ")");
    }
    const Shape qs = input_shape(c, s.batched, s.B, s.Lq, E), ks = input_shape(c, s.batched, s.B, s.Lk, c.kdim),
                vs = input_shape(c, s.batched, s.B, s.Lk, c.vdim);
    if (!(s.query_shape == qs) || !(s.key_shape == ks) || !(s.value_shape == vs)) {
        fail(kMha, "backward: the state's input shapes ", s.query_shape, ", ", s.key_shape, ", ", s.value_shape,
             " are not ", qs, ", ", ks, ", ", vs, " (fill the state with forward_train of this layer)");
    }
    expect("query copy", s.x[0], DType::f32, qs);
    expect("key copy", s.x[1], DType::f32, ks);
    expect("value copy", s.x[2], DType::f32, vs);
    expect("q", s.q, DType::f32, Shape{s.B * s.Lq, E});
    expect("k", s.k, DType::f32, Shape{s.B * s.Lkx, Ekv});
    expect("v", s.v, DType::f32, Shape{s.B * s.Lkx, Ekv});
    expect("attn_out", s.attn_out, DType::f32, Shape{s.B * s.Lq, E});
    expect("lse", s.lse, DType::f32, Shape{s.B, h, s.Lq});
}

}  // namespace attn::detail
