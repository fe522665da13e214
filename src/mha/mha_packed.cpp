// MultiHeadAttention::forward_packed / forward_packed_train: the layer on packed
// variable-length input. The three projections and out_proj are row-wise (linear.hpp), so they
// run on the packed rows as they are; between them attn::sdpa_varlen attends within each
// sequence, its heads seen through stride views of the projected rows ((T, E) as (T, h, d_h))
// — no padding, no copy. The training variant keeps what packed_backward.cpp needs.
#include <cmath>
#include <cstddef>
#include <utility>

#include "attn/mha.hpp"
#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/threads.hpp"
#include "../varlen/varlen_call.hpp"
#include "linear.hpp"
#include "packed_backward.hpp"
#include "projection.hpp"

namespace attn {
namespace detail {

TensorView packed_heads(const Tensor& rows, std::int64_t heads, std::int64_t dh) {
    return TensorView(rows.data(), rows.dtype(), Shape{rows.shape()[0], heads, dh}, Strides{heads * dh, dh, 1});
}

}  // namespace detail

namespace {

constexpr std::string_view kOp = "MultiHeadAttention.forward_packed";

// An owned int64 copy of a cu_seqlens argument for the training state. Only its dtype and rank
// are checked here; sdpa_varlen checks the values (before anything is written).
Tensor owned_offsets(const TensorView& cu, const char* name) {
    if (cu.data() == nullptr || (cu.dtype() != DType::i32 && cu.dtype() != DType::i64) || cu.rank() != 1) {
        const bool int_dtype = cu.dtype() == DType::i32 || cu.dtype() == DType::i64;
        detail::fail_as(cu.data() == nullptr || int_dtype ? ErrorKind::value : ErrorKind::type, kOp, name,
                        ": expected an (N+1,) int32 or int64 tensor but got ",
                        cu.data() == nullptr ? "no data" : dtype_name(cu.dtype()), " ", cu.shape());
    }
    Tensor t(DType::i64, cu.shape());
    for (std::int64_t i = 0; i < cu.dim(0); ++i) t.data_as<std::int64_t>()[i] = detail::load_int(cu, cu.offset(i));
    return t;
}

// The packed forward. `keep` (training) receives float32 copies of the inputs, Q, K, V, O, lse
// and the options; without it nothing is kept. mid: the dtype of Q, K, V and O (float32 when
// training).
Tensor run_packed(const MultiHeadAttention& layer, const TensorView& query, const TensorView& key,
                  const TensorView& value, const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                  const SdpaOptions& options, DType mid, MhaForwardState* keep) {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = layer.head_dim(), Ekv = hkv * dh;
    // The checks' lists and messages (and sdpa_varlen's below) are the call's bookkeeping: a
    // refusal there is attn::OutOfMemory saying so (it was a bare std::bad_alloc), nothing
    // computed yet. Each buffer is named by its own refusal.
    constexpr const char* kBookkeeping = "MultiHeadAttention.forward_packed's argument checks";
    detail::naming_bookkeeping(kBookkeeping, [&] {
        if (c.add_bias_kv || c.add_zero_attn) {
            detail::fail(kOp, "add_bias_kv / add_zero_attn: not supported for packed input (they append keys per sequence)");
        }
        detail::require_rank(kOp, query, "query", 2, "(Tq, E)");
        detail::require_rank(kOp, key, "key", 2, "(Tk, kdim)");
        detail::require_rank(kOp, value, "value", 2, "(Tk, vdim)");
        detail::require_floating(kOp, query, "query");  // before the projections convert them
        detail::require_floating(kOp, key, "key");
        detail::require_floating(kOp, value, "value");
        if (query.dim(1) != E) detail::fail(kOp, "query: expected ", E, " features (embed_dim) but got ", query.dim(1));
        if (key.dim(1) != c.kdim) detail::fail(kOp, "key: expected ", c.kdim, " features (kdim) but got ", key.dim(1));
        if (value.dim(1) != c.vdim) detail::fail(kOp, "value: expected ", c.vdim, " features (vdim) but got ", value.dim(1));
        if (value.dim(0) != key.dim(0)) {
            detail::fail(kOp, "value: has ", value.dim(0), " tokens but key has ", key.dim(0));
        }
    });
    const std::int64_t Tq = query.dim(0), Tk = key.dim(0);
    // The attention's outputs first (allocated, not written), as forward_into ensures its O: the
    // check below sees them as they are, and every view it takes of them lies inside them.
    Tensor attn_out(mid, Shape{Tq, E}, false, "the MHA layer's attention output O (rows, E)");  // sdpa_varlen rounds O once
    Tensor lse = keep ? Tensor(DType::f32, Shape{Tq, h}, false, "the MHA layer's lse (kept for backward)") : Tensor();
    const TensorView out_heads = detail::packed_heads(attn_out, h, dh), lse_view = lse.view();
    // sdpa_varlen's checks of the attention call (cu_seqlens, options, a requested kernel that
    // cannot run it, …) before the projections, whose GEMMs a refused call would waste, as
    // forward_into runs check_call: on stand-ins of the projections' Q, K, V — their shapes, dtype
    // and unit inner stride, never read — whose rows all view attn_out's first dh elements (stride
    // 0: a sequence's rows point where the stand-in does, never past the buffer; with Tq = 0 no
    // sequence has queries, and no sequence's view of them is taken). The checked call then runs
    // on the computed tensors, unchecked again (varlen_call.hpp).
    const auto stand_in = [&](std::int64_t T, std::int64_t heads) {
        return TensorView(attn_out.data(), mid, Shape{T, heads, dh}, Strides{0, 0, 1});
    };
    detail::VarlenCall call;
    detail::naming_bookkeeping(kBookkeeping, [&] {
        call = detail::check_varlen_call(stand_in(Tq, h), stand_in(Tk, hkv), stand_in(Tk, hkv), cu_seqlens_q, cu_seqlens_k,
                                         options, out_heads, keep ? &lse_view : nullptr);
    });

    Tensor copies[3];
    if (keep != nullptr) {  // owned float32 rows: the state outlives the caller's tensors
        copies[0] = to_dtype(query, DType::f32, "the MHA layer's packed training state's float32 copy of query");
        copies[1] = to_dtype(key, DType::f32, "the MHA layer's packed training state's float32 copy of key");
        copies[2] = to_dtype(value, DType::f32, "the MHA layer's packed training state's float32 copy of value");
    }
    const detail::Operand xq = detail::as_rows(keep ? copies[0].view() : query, copies[0], detail::kQueryRows);
    const detail::Operand xk = detail::as_rows(keep ? copies[1].view() : key, copies[1], detail::kKeyRows);
    const detail::Operand xv = detail::as_rows(keep ? copies[2].view() : value, copies[2], detail::kValueRows);
    const detail::InputWeights w = detail::input_weights(layer, keep == nullptr);  // inference: pre-packed weights
    Tensor q(DType::f32, Shape{Tq, E}, false, "the MHA layer's projected Q"),
        k(DType::f32, Shape{Tk, Ekv}, false, "the MHA layer's projected K"),
        v(DType::f32, Shape{Tk, Ekv}, false, "the MHA layer's projected V");
    detail::linear(xq, Tq, E, E, w.wq, E, w.bq, q.data_as<float>(), E);
    detail::linear(xk, Tk, c.kdim, c.kdim, w.wk, Ekv, w.bk, k.data_as<float>(), Ekv);
    detail::linear(xv, Tk, c.vdim, c.vdim, w.wv, Ekv, w.bv, v.data_as<float>(), Ekv);
    q = detail::rounded_rows(std::move(q), mid);
    k = detail::rounded_rows(std::move(k), mid);
    v = detail::rounded_rows(std::move(v), mid);

    detail::run_varlen_call(std::move(call), detail::packed_heads(q, h, dh), detail::packed_heads(k, hkv, dh),
                            detail::packed_heads(v, hkv, dh), cu_seqlens_q, cu_seqlens_k, options, out_heads,
                            keep ? &lse_view : nullptr);

    Tensor out(DType::f32, Shape{Tq, E}, false, "the MHA layer's output");
    const float* ob = c.bias ? layer.parameter("out_proj.bias").data_as<const float>() : nullptr;
    detail::linear(detail::Operand(attn_out.data(), mid), Tq, E, E, detail::out_weight(layer, keep == nullptr), E, ob,
                   out.data_as<float>(), E);
    if (keep != nullptr) {
        MhaForwardState& s = *keep;
        s.layer = c;
        s.query_shape = query.shape();
        s.key_shape = key.shape();
        s.value_shape = value.shape();
        for (int i = 0; i < 3; ++i) s.x[i] = std::move(copies[i]);
        s.q = std::move(q);
        s.k = std::move(k);
        s.v = std::move(v);
        s.attn_out = std::move(attn_out);
        s.lse = std::move(lse);
        return out;  // training: float32, as forward_train's output
    }
    return detail::rounded_rows(std::move(out), detail::output_dtype(std::nullopt, query.dtype()));
}

}  // namespace

Tensor MultiHeadAttention::forward_packed(const TensorView& query, const TensorView& key, const TensorView& value,
                                          const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                          const MhaPackedOptions& options) const {
    SdpaOptions o;
    o.causal = options.causal;
    o.impl = options.impl;  // scale: sdpa's default 1/√d_h, as the layer's
    score_modifiers(o);     // the layer's softcap, ALiBi and sinks, as forward() applies them
    return run_packed(*this, query, key, value, cu_seqlens_q, cu_seqlens_k, o,
                      detail::intermediate_dtype(options.intermediate_dtype), nullptr);
}

Tensor MultiHeadAttention::forward_packed_train(const TensorView& query, const TensorView& key,
                                                const TensorView& value, const TensorView& cu_seqlens_q,
                                                const TensorView& cu_seqlens_k, const MhaPackedOptions& options,
                                                const MhaTrainOptions& train, MhaForwardState& state) const {
    detail::require_dropout(kOp, train.dropout_p, train.dropout_seed);
    if (config().param_dtype != DType::f32) {
        detail::fail_type(kOp, "forward_packed_train: the weight matrices are stored in ", dtype_name(config().param_dtype),
                     "; training needs float32 parameters (set_param_dtype(float32) first)");
    }
    if (detail::intermediate_dtype(options.intermediate_dtype) != DType::f32) {
        detail::fail_type(kOp, "intermediate_dtype: forward_packed_train keeps float32 intermediates (backward reads them) but got ",
                     dtype_name(*options.intermediate_dtype));
    }
    MhaForwardState s;
    s.sdpa.causal = options.causal;
    s.sdpa.impl = options.impl;
    s.sdpa.dropout_p = train.dropout_p;
    s.sdpa.dropout_seed = train.dropout_seed;
    score_modifiers(s.sdpa);
    detail::own_score_modifiers(s);  // the state outlives this layer's views
    s.cu_seqlens_q = owned_offsets(cu_seqlens_q, "cu_seqlens_q");
    s.cu_seqlens_k = owned_offsets(cu_seqlens_k, "cu_seqlens_k");
    Tensor out = run_packed(*this, query, key, value, s.cu_seqlens_q, s.cu_seqlens_k, s.sdpa, DType::f32, &s);
    state = std::move(s);
    return out;
}

}  // namespace attn
