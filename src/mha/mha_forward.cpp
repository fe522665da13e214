// MultiHeadAttention::forward: projections (sgemm, stored head-major) → heads by strides →
// attn::sdpa → out projection (sgemm). The checks, the PyTorch masks and the projections are
// shared with forward_train (inputs.hpp, masks.hpp, projection.hpp).
#include <cstring>

#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/float_env.hpp"
#include "attn/mha.hpp"
#include "inputs.hpp"
#include "linear.hpp"
#include "masks.hpp"
#include "projection.hpp"
#include "../sdpa/problem.hpp"
#include "../core/threads.hpp"

namespace attn {
namespace {

using detail::fail;
using detail::fail_type;
using detail::kMha;

// The caller's outputs: contiguous, of the shapes forward() would allocate; output float32,
// float16 or bfloat16 (out_dtype, when set, names the one expected), weights float32.
void check_outputs(const MultiHeadAttention& m, const TensorView& query, const TensorView& key, const TensorView& value,
                   const MhaForwardOptions& options, const TensorView& output, const TensorView* weights) {
    detail::check_output("output", output, m.output_shape(query));
    if (options.out_dtype && detail::output_dtype(options.out_dtype, query.dtype()) != output.dtype()) {
        fail_type(kMha, "output: out_dtype is ", dtype_name(*options.out_dtype), " but the output tensor is ", dtype_name(output.dtype()));
    }
    if (options.need_weights != (weights != nullptr)) {
        fail(kMha, "weights: ", options.need_weights ? "need_weights is set but no weights tensor was given"
                                                      : "a weights tensor was given but need_weights is not set");
    }
    if (weights != nullptr) detail::check_output("weights", *weights, m.weights_shape(query, key, options.average_attn_weights), true);
    // The output may be an input itself (in place); the weights, written by attention, and the
    // masks, read by it, stay apart from everything.
    const std::vector<detail::Named> activations{{&query, "query"}, {&key, "key"}, {&value, "value"}};
    detail::require_output_in_place_or_apart(kMha, output, activations);
    detail::require_apart(kMha, {{detail::view_or_null(options.attn_mask), "attn_mask"},
                                 {detail::view_or_null(options.key_padding_mask), "key_padding_mask"}},
                          {{&output, "output"}, {weights, "weights"}});
    detail::require_apart(kMha, activations, {{weights, "weights"}});
    detail::require_apart_from_parameters(kMha, m, {{&output, "output"}, {weights, "weights"}});
}

// PyTorch: weights.view(B, h, Lq, Lk).mean(dim=1)
void average_heads(const float* per_head, std::int64_t B, std::int64_t h, std::int64_t plane, float* dst) {
    const float inv = 1.0f / static_cast<float>(h);
#pragma omp parallel
    {
        const detail::IeeeSubnormals ieee;  // each thread with IEEE subnormals (core/float_env.hpp)
#pragma omp for schedule(static)
        for (std::int64_t b = 0; b < B; ++b) {
            float* d = dst + b * plane;
            std::memcpy(d, per_head + b * h * plane, static_cast<std::size_t>(plane) * sizeof(float));
            for (std::int64_t j = 1; j < h; ++j) {
                const float* s = per_head + (b * h + j) * plane;
                for (std::int64_t x = 0; x < plane; ++x) d[x] += s[x];
            }
            for (std::int64_t x = 0; x < plane; ++x) d[x] *= inv;
        }
    }
}

}  // namespace

Shape MultiHeadAttention::output_shape(const TensorView& query) const {
    // query (L, B, E) / (B, L, E) / (L, E) → the same with E = embed_dim
    if (query.rank() == 3) return Shape{query.dim(0), query.dim(1), config_.embed_dim};
    if (query.rank() == 2) return Shape{query.dim(0), config_.embed_dim};
    fail(kMha, "query: expected a rank-3 tensor (L, B, E) / (B, L, E) or rank-2 (L, E) but got shape ", query.shape());
}

Shape MultiHeadAttention::weights_shape(const TensorView& query, const TensorView& key, bool average) const {
    // weights: (B, Lq, Lk') averaged or (B, h, Lq, Lk') per head; unbatched without B.
    const bool batched = query.rank() == 3;
    const int ld = batched && config_.batch_first ? 1 : 0;  // the length dim
    const std::int64_t Lq = query.dim(ld), h = config_.num_heads;
    const std::int64_t Lk = key.dim(ld) + (config_.add_bias_kv ? 1 : 0) + (config_.add_zero_attn ? 1 : 0);
    if (!batched) return average ? Shape{Lq, Lk} : Shape{h, Lq, Lk};
    const std::int64_t B = config_.batch_first ? query.dim(0) : query.dim(1);
    return average ? Shape{B, Lq, Lk} : Shape{B, h, Lq, Lk};
}

MhaOutput MultiHeadAttention::forward(const TensorView& query, const TensorView& key, const TensorView& value,
                                      const MhaForwardOptions& options, MhaWorkspace* workspace) const {
    // Outputs sized from the inputs; forward_into checks everything (a key of the wrong
    // rank gets no weights tensor here and its error there).
    MhaOutput r;
    r.output = Tensor(detail::output_dtype(options.out_dtype, query.dtype()), output_shape(query), false,
                      "the MHA layer's output");
    TensorView wv;
    if (options.need_weights && key.rank() == query.rank()) {
        r.weights = Tensor(DType::f32, weights_shape(query, key, options.average_attn_weights), false,
                           "the MHA layer's attention weights");
        wv = r.weights.view();
    }
    forward_into(query, key, value, options, r.output, options.need_weights ? &wv : nullptr, workspace);
    return r;
}

void MultiHeadAttention::forward_into(const TensorView& query, const TensorView& key, const TensorView& value,
                                      const MhaForwardOptions& options, const TensorView& output,
                                      const TensorView* weights, MhaWorkspace* workspace) const {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, h = c.num_heads, dh = head_dim();
    // ---- checks (nothing is written before they all pass) ----
    // The checks' lists and messages and the PyTorch masks' views are the call's bookkeeping: a
    // refusal there is attn::OutOfMemory saying so (it was a bare std::bad_alloc), nothing written
    // yet. A mask the call combines or pads is a buffer, named by its own refusal.
    constexpr const char* kBookkeeping = "the MHA layer's argument checks and masks";
    detail::MhaShapes s;
    detail::PytorchMasks pt;
    detail::SdpaMasks masks;
    DType mid = DType::f32;  // Q, K, V and O
    detail::naming_bookkeeping(kBookkeeping, [&] {
        s = detail::check_inputs(c, query, key, value, options);
        check_outputs(*this, query, key, value, options, output, weights);
        pt = detail::pytorch_masks_4d(options.attn_mask, options.key_padding_mask, s.batched, s.B, h, s.Lq, s.Lk);
        // The appended keys are never masked (PyTorch pads the masks with 0 / False).
        if (s.extra > 0) detail::pad_masks(pt, s.Lkx);
        masks = detail::to_sdpa_masks(pt.attn, pt.kpm);
        mid = detail::intermediate_dtype(options.intermediate_dtype);
    });
    MhaWorkspace local;
    MhaWorkspace& ws = workspace != nullptr ? *workspace : local;

    // ---- the attention call: its options and outputs, then its checks — before the projections,
    // whose GEMMs a call sdpa refuses (impl = decode for 20 queries, a non-finite sink edited
    // in place, …) would waste. O is (Nq, E) in the intermediates' dtype: sdpa rounds it once
    // from its float32 accumulators, written as (rows of query, h, d_h) — the merge of heads is free.
    // Every buffer of the call after the projections' is taken here, before anything is written:
    // a 16-bit output's float32 rows too ----
    SdpaOptions so;
    so.impl = options.impl;
    so.causal = options.causal;
    so.bool_mask = masks.keep;
    so.additive_mask = masks.add;
    score_modifiers(so);
    const std::int64_t Nq = s.B * s.Lq;
    Tensor& o = mid == DType::f32 ? ws.attn_out : ws.attn_out16;
    detail::ensure(o, mid, Shape{Nq, E}, "the MHA layer's attention output O (rows, E)");
    const TensorView O = detail::heads_view(o.data(), mid, E, 0, s.rq, s.B, h, s.Lq, dh);
    const Shape per_head_shape{s.B, h, s.Lq, s.Lkx};
    TensorView per_head;
    if (weights != nullptr) {
        per_head = options.average_attn_weights
                       ? TensorView(detail::ensure(ws.head_weights, per_head_shape, "the MHA layer's per-head attention weights"),
                                    DType::f32, per_head_shape)
                       : TensorView(weights->data(), DType::f32, per_head_shape);
    }
    const bool f32_out = output.dtype() == DType::f32;
    float* y = f32_out ? output.data_as<float>() : detail::ensure(ws.out_f32, Shape{Nq, E}, "the MHA layer's float32 output rows");
    detail::naming_bookkeeping(kBookkeeping, [&] {
        // Stand-ins of the projections' Q, K, V (shapes, dtype, unit inner stride; never read).
        const auto stand_in = [&](std::int64_t heads, std::int64_t L) {
            return TensorView(o.data(), mid, Shape{s.B, heads, L, dh}, Strides{0, 0, 0, 1});
        };
        const std::int64_t hkv = c.num_kv_heads;
        detail::check_call(stand_in(h, s.Lq), stand_in(hkv, s.Lkx), stand_in(hkv, s.Lkx), so, O,
                           weights != nullptr ? &per_head : nullptr);
    });

    // ---- projections: each head's Q, K, V a (rows, d_h) matrix of its own, rows batch-major
    // whatever the input's order (head-major: the attention reads a head's K/V rows in place) ----
    detail::ProjectionPlan plan;
    plan.self_attention = detail::same_view(query, key) && detail::same_view(key, value);
    plan.shared_kv = detail::same_view(key, value);
    plan.batch_major = s.extra > 0;
    plan.use_packed = true;
    plan.head_major = true;
    const detail::Operand xq = detail::as_rows(query, ws.input_copy[0], detail::kQueryRows);
    const detail::Operand xk = plan.self_attention ? xq : detail::as_rows(key, ws.input_copy[1], detail::kKeyRows);
    const detail::Operand xv = plan.shared_kv ? xk : detail::as_rows(value, ws.input_copy[2], detail::kValueRows);
    detail::Projected p = detail::project_qkv(*this, s, xq, xk, xv, plan, ws);
    if (mid != DType::f32) p = detail::round_projected(p, mid, ws);

    // ---- attention ----
    sdpa(p.Q, p.K, p.V, so, O, nullptr, weights != nullptr ? &per_head : nullptr);

    // ---- out projection straight into the output (same row order as the query); a 16-bit
    // output gets the float32 rows rounded once ----
    const float* out_bias = c.bias ? parameter("out_proj.bias").data_as<const float>() : nullptr;
    detail::linear(detail::Operand(o.data(), mid), Nq, E, E, detail::out_weight(*this, true), E, out_bias, y, E);
    if (!f32_out) detail::store_output(y, output);
    if (weights != nullptr && options.average_attn_weights) {
        average_heads(per_head.data_as<const float>(), s.B, h, s.Lq * s.Lkx, weights->data_as<float>());
    }
}

}  // namespace attn
