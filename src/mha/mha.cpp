// attn::MultiHeadAttention: checks, parameters (PyTorch names), and the forward pass
//   projections (sgemm) → heads by strides → attn::sdpa → out projection (sgemm).
#include "attn/mha.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "attn/error.hpp"
#include "head_layout.hpp"
#include "linear.hpp"
#include "masks.hpp"

namespace attn {
namespace {

using detail::heads_view;
using detail::Rows;
using detail::rows_of;

std::string num(std::int64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& msg) { throw Error("MultiheadAttention: " + msg); }

bool same_tensor(const TensorView& a, const TensorView& b) {
    return a.data() == b.data() && a.dtype() == b.dtype() && a.shape() == b.shape() && a.strides() == b.strides();
}

// Re-allocates a workspace tensor only when the shape changes, so repeated calls reuse
// memory that is already faulted in.
float* ensure(Tensor& t, const Shape& shape) {
    if (t.data() == nullptr || t.dtype() != DType::f32 || !(t.shape() == shape)) t = Tensor(DType::f32, shape);
    return t.data_as<float>();
}

// Rows of an input as a (rows, features) float32 matrix with unit column stride:
// the input itself when it is contiguous float32, else a copy.
const float* as_rows(const TensorView& x, Tensor& copy) {
    if (x.dtype() == DType::f32 && x.is_contiguous()) return x.data_as<const float>();
    copy = to_dtype(x, DType::f32);
    return copy.data_as<const float>();
}

void check_mask_dtype(const TensorView& m, const char* name, const char* bool_meaning) {
    if (m.data() == nullptr) fail(std::string(name) + ": data pointer is null");
    if (m.dtype() != DType::boolean && !is_floating(m.dtype())) {
        fail(std::string(name) + ": dtype must be bool (True = " + bool_meaning + ") or floating (added to the scores) but got " +
             std::string(dtype_name(m.dtype())));
    }
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config) : config_(config) {
    MhaConfig& c = config_;
    if (c.embed_dim < 1) fail("embed_dim must be >= 1 but got " + num(c.embed_dim));
    if (c.num_heads < 1) fail("num_heads must be >= 1 but got " + num(c.num_heads));
    if (c.embed_dim % c.num_heads != 0) {
        fail("embed_dim " + num(c.embed_dim) + " must be divisible by num_heads " + num(c.num_heads));
    }
    if (c.kdim == 0) c.kdim = c.embed_dim;
    if (c.vdim == 0) c.vdim = c.embed_dim;
    if (c.kdim < 1) fail("kdim must be >= 1 (or 0 for embed_dim) but got " + num(c.kdim));
    if (c.vdim < 1) fail("vdim must be >= 1 (or 0 for embed_dim) but got " + num(c.vdim));
    if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
    if (c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0) {
        fail("num_kv_heads must divide num_heads " + num(c.num_heads) + " but got " + num(c.num_kv_heads));
    }
    for (const auto& [name, shape] : parameter_shapes()) params_.emplace(name, Tensor(DType::f32, shape, true));
}

std::vector<std::pair<std::string, Shape>> MultiHeadAttention::parameter_shapes() const {
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, Ekv = c.num_kv_heads * head_dim();
    std::vector<std::pair<std::string, Shape>> p;
    if (c.kdim == E && c.vdim == E) {
        p.emplace_back("in_proj_weight", Shape{E + 2 * Ekv, E});
    } else {
        p.emplace_back("q_proj_weight", Shape{E, E});
        p.emplace_back("k_proj_weight", Shape{Ekv, c.kdim});
        p.emplace_back("v_proj_weight", Shape{Ekv, c.vdim});
    }
    if (c.bias) p.emplace_back("in_proj_bias", Shape{E + 2 * Ekv});
    if (c.add_bias_kv) {
        p.emplace_back("bias_k", Shape{1, 1, Ekv});
        p.emplace_back("bias_v", Shape{1, 1, Ekv});
    }
    p.emplace_back("out_proj.weight", Shape{E, E});
    if (c.bias) p.emplace_back("out_proj.bias", Shape{E});
    return p;
}

TensorView MultiHeadAttention::parameter(std::string_view name) const {
    const auto it = params_.find(name);
    if (it == params_.end()) fail("no parameter named '" + std::string(name) + "' in this configuration");
    return it->second.view();
}

std::vector<std::pair<std::string, TensorView>> MultiHeadAttention::state_dict() const {
    std::vector<std::pair<std::string, TensorView>> out;
    for (const auto& [name, shape] : parameter_shapes()) out.emplace_back(name, parameter(name));
    return out;
}

void MultiHeadAttention::load_state_dict(const std::vector<std::pair<std::string, TensorView>>& tensors) {
    // All problems are collected and reported together; nothing is copied unless none.
    std::string problems;
    auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
    const auto expected = parameter_shapes();
    for (const auto& [name, shape] : expected) {
        const auto it = std::find_if(tensors.begin(), tensors.end(), [&n = name](const auto& t) { return t.first == n; });
        if (it == tensors.end()) {
            add("missing tensor '" + name + "' (expected shape " + shape.str() + ")");
        } else if (!(it->second.shape() == shape)) {
            add("tensor '" + name + "': expected shape " + shape.str() + " but got " + it->second.shape().str());
        } else if (!is_floating(it->second.dtype())) {
            add("tensor '" + name + "': expected a floating dtype but got " + std::string(dtype_name(it->second.dtype())));
        } else if (it->second.data() == nullptr && shape.numel() != 0) {
            add("tensor '" + name + "': data pointer is null");
        }
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const std::string& name = tensors[i].first;
        const bool known = std::any_of(expected.begin(), expected.end(), [&](const auto& e) { return e.first == name; });
        if (!known) {
            std::string why;
            if (name == "bias_k" || name == "bias_v") why = " (the layer was built without add_bias_kv)";
            add("unexpected tensor '" + name + "' with shape " + tensors[i].second.shape().str() + why);
        }
        for (std::size_t j = 0; j < i; ++j)
            if (tensors[j].first == name) add("tensor '" + name + "' is given more than once");
    }
    if (!problems.empty()) fail("state_dict does not fit (E=" + num(config_.embed_dim) + ", heads=" + num(config_.num_heads) +
                                ", kv heads=" + num(config_.num_kv_heads) + ", kdim=" + num(config_.kdim) + ", vdim=" +
                                num(config_.vdim) + ", bias=" + (config_.bias ? "true" : "false") + "): " + problems);
    for (const auto& [name, view] : tensors) {
        Tensor& dst = params_.at(name);
        const Tensor f = to_dtype(view, DType::f32);
        std::memcpy(dst.data(), f.data(), dst.nbytes());
    }
}

MultiHeadAttention MultiHeadAttention::from_state_dict(const std::vector<std::pair<std::string, TensorView>>& tensors,
                                                       std::int64_t num_heads, bool batch_first) {
    auto find = [&](const char* name) -> const TensorView* {
        for (const auto& [n, t] : tensors)
            if (n == name) return &t;
        return nullptr;
    };
    const TensorView* wo = find("out_proj.weight");
    if (wo == nullptr) fail("state_dict: missing tensor 'out_proj.weight' (expected shape (E, E); it gives embed_dim)");
    if (wo->rank() != 2 || wo->dim(0) != wo->dim(1) || wo->dim(0) < 1) {
        fail("state_dict: tensor 'out_proj.weight': expected shape (E, E) but got " + wo->shape().str());
    }
    MhaConfig c;
    c.embed_dim = wo->dim(0);
    c.num_heads = num_heads;
    c.batch_first = batch_first;
    if (num_heads < 1) fail("num_heads must be >= 1 but got " + num(num_heads));
    if (c.embed_dim % num_heads != 0) {
        fail("embed_dim " + num(c.embed_dim) + " (from out_proj.weight) must be divisible by num_heads " + num(num_heads));
    }
    const std::int64_t E = c.embed_dim, dh = E / num_heads;
    std::int64_t Ekv = E;
    if (const TensorView* w = find("in_proj_weight")) {
        // (E + 2·E_kv, E); E_kv = E unless the weights are grouped-query.
        if (w->rank() != 2 || w->dim(1) != E || w->dim(0) <= E || (w->dim(0) - E) % 2 != 0) {
            fail("state_dict: tensor 'in_proj_weight': expected shape (3·E, E) = " + Shape{3 * E, E}.str() +
                 " (or (E + 2·E_kv, E) for grouped-query attention) but got " + w->shape().str());
        }
        Ekv = (w->dim(0) - E) / 2;
    } else {
        const TensorView* k = find("k_proj_weight");
        const TensorView* v = find("v_proj_weight");
        if (k == nullptr || v == nullptr || find("q_proj_weight") == nullptr) {
            fail("state_dict: missing tensor 'in_proj_weight' (expected shape " + Shape{3 * E, E}.str() +
                 "), or q_proj_weight, k_proj_weight and v_proj_weight when kdim or vdim differ from embed_dim");
        }
        if (k->rank() != 2 || k->dim(1) < 1) fail("state_dict: tensor 'k_proj_weight': expected shape (E, kdim) but got " + k->shape().str());
        if (v->rank() != 2 || v->dim(1) < 1) fail("state_dict: tensor 'v_proj_weight': expected shape (E, vdim) but got " + v->shape().str());
        c.kdim = k->dim(1);
        c.vdim = v->dim(1);
        Ekv = k->dim(0);
    }
    if (Ekv < 1 || Ekv % dh != 0 || num_heads % (Ekv / dh) != 0) {
        fail("state_dict: key/value projections have " + num(Ekv) + " outputs, which is not a number of heads of size " +
             num(dh) + " dividing num_heads " + num(num_heads) + " (expected " + num(E) + ")");
    }
    c.num_kv_heads = Ekv / dh;
    c.bias = find("in_proj_bias") != nullptr || find("out_proj.bias") != nullptr;
    c.add_bias_kv = find("bias_k") != nullptr || find("bias_v") != nullptr;
    MultiHeadAttention layer(c);
    layer.load_state_dict(tensors);
    return layer;
}

Shape MultiHeadAttention::output_shape(const TensorView& query) const {
    // query (L, B, E) / (B, L, E) / (L, E) → the same with E = embed_dim
    if (query.rank() == 3) return Shape{query.dim(0), query.dim(1), config_.embed_dim};
    if (query.rank() == 2) return Shape{query.dim(0), config_.embed_dim};
    fail("query: expected a rank-3 tensor (L, B, E) / (B, L, E) or rank-2 (L, E) but got shape " + query.shape().str());
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
    r.output = Tensor(DType::f32, output_shape(query));
    TensorView wv;
    if (options.need_weights && key.rank() == query.rank()) {
        r.weights = Tensor(DType::f32, weights_shape(query, key, options.average_attn_weights));
        wv = r.weights.view();
    }
    forward_into(query, key, value, options, r.output, options.need_weights ? &wv : nullptr, workspace);
    return r;
}

void MultiHeadAttention::forward_into(const TensorView& query, const TensorView& key, const TensorView& value,
                                      const MhaForwardOptions& options, const TensorView& output,
                                      const TensorView* weights, MhaWorkspace* workspace) const {
    // query (Lq, B, E) | (B, Lq, E) | (Lq, E);  key (Lk, B, kdim) ...;  value (Lk, B, vdim) ...
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = head_dim(), Ekv = hkv * dh;

    // ---- checks (nothing is written before they all pass) ----
    for (const auto& [t, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}}) {
        if (t->data() == nullptr) fail(std::string(name) + ": data pointer is null");
        if (!is_floating(t->dtype())) fail(std::string(name) + ": dtype must be floating but got " + std::string(dtype_name(t->dtype())));
    }
    const Shape os = output_shape(query);  // checks query's rank
    const bool batched = query.rank() == 3;
    const char* layout = !batched ? "(L, E)" : (c.batch_first ? "(B, L, E)" : "(L, B, E)");
    if (key.rank() != query.rank() || value.rank() != query.rank()) {
        fail(std::string("key and value must have the rank of query ") + layout + " = " + num(query.rank()) +
             " but got key " + key.shape().str() + ", value " + value.shape().str());
    }
    const int bd = c.batch_first ? 0 : 1, ld = batched ? (c.batch_first ? 1 : 0) : 0;
    const std::int64_t B = batched ? query.dim(bd) : 1;
    const std::int64_t Lq = query.dim(ld), Lk = key.dim(ld);
    if (query.dim(query.rank() - 1) != E) {
        fail("query: expected " + std::string(layout) + " with E = embed_dim = " + num(E) + " but got shape " + query.shape().str());
    }
    auto expect_kv = [&](const TensorView& t, const char* name, std::int64_t feat, const char* featname) {
        const Shape want = !batched ? Shape{Lk, feat} : (c.batch_first ? Shape{B, Lk, feat} : Shape{Lk, B, feat});
        if (!(t.shape() == want)) {
            fail(std::string(name) + ": expected shape " + layout + " = " + want.str() + " (batch of query, length of key, " +
                 featname + ") but got " + t.shape().str());
        }
    };
    expect_kv(key, "key", c.kdim, "kdim");
    expect_kv(value, "value", c.vdim, "vdim");
    if (Lq < 1 || Lk < 1 || B < 1) {
        fail("query and key must have at least one element in batch and length but got query " + query.shape().str() +
             ", key " + key.shape().str());
    }
    // add_bias_kv appends the key/value bias_k/bias_v, add_zero_attn then a zero key/value
    // (PyTorch's order); masks see them as allowed, weights have their columns.
    const std::int64_t extra = (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0), Lkx = Lk + extra;
    if (extra > 0 && options.is_causal) {
        fail("is_causal: not supported together with add_bias_kv / add_zero_attn; pass a causal attn_mask (Lq, Lk) instead");
    }
    if (output.data() == nullptr || output.dtype() != DType::f32 || !output.is_contiguous() || !(output.shape() == os)) {
        fail("output: expected a contiguous float32 tensor of shape " + os.str() + " but got " +
             std::string(dtype_name(output.dtype())) + " " + output.shape().str());
    }
    if (options.need_weights != (weights != nullptr)) {
        fail(std::string("weights: ") + (options.need_weights ? "need_weights is set but no weights tensor was given"
                                                               : "a weights tensor was given but need_weights is not set"));
    }
    if (weights != nullptr) {
        const Shape ws = weights_shape(query, key, options.average_attn_weights);
        if (weights->data() == nullptr || weights->dtype() != DType::f32 || !weights->is_contiguous() || !(weights->shape() == ws)) {
            fail("weights: expected a contiguous float32 tensor of shape " + ws.str() + " but got " +
                 std::string(dtype_name(weights->dtype())) + " " + weights->shape().str());
        }
    }

    // Masks, in PyTorch's shapes, as 4-D views (b, head, i, j) with stride 0 where broadcast.
    std::optional<TensorView> attn4, kpm4;
    if (options.attn_mask) {
        const TensorView& m = *options.attn_mask;
        check_mask_dtype(m, "attn_mask", "not allowed");
        const Shape s2{Lq, Lk}, s3{batched ? B * h : h, Lq, Lk};
        if (m.shape() == s2) {
            attn4 = TensorView(m.data(), m.dtype(), Shape{1, 1, Lq, Lk}, Strides{0, 0, m.stride(0), m.stride(1)});
        } else if (m.shape() == s3) {
            // (B·h, Lq, Lk): index b·h + head, so b strides h rows of dim 0.
            attn4 = TensorView(m.data(), m.dtype(), Shape{B, h, Lq, Lk},
                               Strides{h * m.stride(0), m.stride(0), m.stride(1), m.stride(2)});
        } else {
            fail("attn_mask: expected shape (Lq, Lk) = " + s2.str() + " or " + (batched ? "(B·num_heads, Lq, Lk) = " : "(num_heads, Lq, Lk) = ") +
                 s3.str() + " but got " + m.shape().str());
        }
    }
    if (options.key_padding_mask) {
        const TensorView& m = *options.key_padding_mask;
        check_mask_dtype(m, "key_padding_mask", "padding");
        const Shape want = batched ? Shape{B, Lk} : Shape{Lk};
        if (!(m.shape() == want)) {
            fail("key_padding_mask: expected shape " + std::string(batched ? "(B, Lk) = " : "(Lk,) = ") + want.str() +
                 " but got " + m.shape().str());
        }
        kpm4 = batched ? TensorView(m.data(), m.dtype(), Shape{B, 1, 1, Lk}, Strides{m.stride(0), 0, 0, m.stride(1)})
                       : TensorView(m.data(), m.dtype(), Shape{1, 1, 1, Lk}, Strides{0, 0, 0, m.stride(0)});
    }

    MhaWorkspace local;
    MhaWorkspace& ws = workspace != nullptr ? *workspace : local;
    Tensor attn_padded, kpm_padded;
    if (extra > 0) {  // the appended keys are never masked (PyTorch pads the masks with 0 / False)
        if (attn4) attn4 = (attn_padded = detail::pad_keys(*attn4, Lkx)).view();
        if (kpm4) kpm4 = (kpm_padded = detail::pad_keys(*kpm4, Lkx)).view();
    }
    const detail::SdpaMasks masks = detail::to_sdpa_masks(attn4, kpm4);

    // ---- projections: rows keep the input's order, heads are column blocks ----
    const Rows rq = rows_of(batched, c.batch_first, B, Lq), rk = rows_of(batched, c.batch_first, B, Lk);
    const std::int64_t Nq = B * Lq, Nk = B * Lk;
    const bool packed = c.kdim == E && c.vdim == E;  // in_proj_weight holds W_Q, W_K, W_V
    const float* bias = c.bias ? parameter("in_proj_bias").data_as<const float>() : nullptr;
    const float* wq = packed ? parameter("in_proj_weight").data_as<const float>() : parameter("q_proj_weight").data_as<const float>();
    const float* wk = packed ? wq + E * E : parameter("k_proj_weight").data_as<const float>();
    const float* wv = packed ? wk + Ekv * E : parameter("v_proj_weight").data_as<const float>();
    const float* bq = bias, *bk = bias ? bias + E : nullptr, *bv = bias ? bias + E + Ekv : nullptr;

    TensorView Q, K, V;
    if (extra > 0) {
        // K and V get Lk + extra rows per batch item: one GEMM per item into (B, Lkx, E_kv)
        // buffers, then the appended rows. Rows of item b in the input: b·rb + l·rl.
        float* q = ensure(ws.proj_q, Shape{Nq, E});
        detail::linear(as_rows(query, ws.input_copy[0]), Nq, E, E, wq, E, bq, q, E);
        Q = heads_view(q, E, 0, rq, B, h, Lq, dh);
        float* k = ensure(ws.proj_kv, Shape{B * Lkx, Ekv});
        float* v = ensure(ws.proj_v, Shape{B * Lkx, Ekv});
        const float* xk = as_rows(key, ws.input_copy[1]);
        const float* xv = as_rows(value, ws.input_copy[2]);
        const float* bias_k = c.add_bias_kv ? parameter("bias_k").data_as<const float>() : nullptr;
        const float* bias_v = c.add_bias_kv ? parameter("bias_v").data_as<const float>() : nullptr;
        for (std::int64_t b = 0; b < B; ++b) {
            detail::linear(xk + b * rk.rb * c.kdim, Lk, c.kdim, rk.rl * c.kdim, wk, Ekv, bk, k + b * Lkx * Ekv, Ekv);
            detail::linear(xv + b * rk.rb * c.vdim, Lk, c.vdim, rk.rl * c.vdim, wv, Ekv, bv, v + b * Lkx * Ekv, Ekv);
            std::int64_t row = b * Lkx + Lk;
            const std::size_t bytes = static_cast<std::size_t>(Ekv) * sizeof(float);
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
        K = heads_view(k, Ekv, 0, rkx, B, hkv, Lkx, dh);
        V = heads_view(v, Ekv, 0, rkx, B, hkv, Lkx, dh);
    } else if (packed && same_tensor(query, key) && same_tensor(key, value)) {
        // Self-attention: one GEMM X (N, E) · [W_Q; W_K; W_V]ᵀ → (N, E + 2·E_kv), i.e. per row
        // (3, h, d_h) without GQA; Q, K and V are strided views of it.
        const std::int64_t n = E + 2 * Ekv;
        float* qkv = ensure(ws.proj_q, Shape{Nq, n});
        detail::linear(as_rows(query, ws.input_copy[0]), Nq, E, E, wq, n, bias, qkv, n);
        Q = heads_view(qkv, n, 0, rq, B, h, Lq, dh);
        K = heads_view(qkv, n, E, rk, B, hkv, Lk, dh);
        V = heads_view(qkv, n, E + Ekv, rk, B, hkv, Lk, dh);
    } else {
        float* q = ensure(ws.proj_q, Shape{Nq, E});
        detail::linear(as_rows(query, ws.input_copy[0]), Nq, E, E, wq, E, bq, q, E);
        Q = heads_view(q, E, 0, rq, B, h, Lq, dh);
        if (packed && same_tensor(key, value)) {
            // Cross-attention on one memory tensor: one GEMM for K and V.
            float* kv = ensure(ws.proj_kv, Shape{Nk, 2 * Ekv});
            detail::linear(as_rows(key, ws.input_copy[1]), Nk, E, E, wk, 2 * Ekv, bk, kv, 2 * Ekv);
            K = heads_view(kv, 2 * Ekv, 0, rk, B, hkv, Lk, dh);
            V = heads_view(kv, 2 * Ekv, Ekv, rk, B, hkv, Lk, dh);
        } else {
            float* k = ensure(ws.proj_kv, Shape{Nk, Ekv});
            float* v = ensure(ws.proj_v, Shape{Nk, Ekv});
            detail::linear(as_rows(key, ws.input_copy[1]), Nk, c.kdim, c.kdim, wk, Ekv, bk, k, Ekv);
            detail::linear(as_rows(value, ws.input_copy[2]), Nk, c.vdim, c.vdim, wv, Ekv, bv, v, Ekv);
            K = heads_view(k, Ekv, 0, rk, B, hkv, Lk, dh);
            V = heads_view(v, Ekv, 0, rk, B, hkv, Lk, dh);
        }
    }

    // ---- attention: O written as (rows of query, h, d_h) — the merge of heads is free ----
    SdpaOptions so;
    so.impl = options.impl;
    so.causal = options.is_causal ? Causal::top_left : Causal::none;
    so.bool_mask = masks.keep;
    so.additive_mask = masks.add;
    float* o = ensure(ws.attn_out, Shape{Nq, E});
    const TensorView O = heads_view(o, E, 0, rq, B, h, Lq, dh);
    TensorView per_head;  // (B, h, Lq, Lk + extra)
    if (weights != nullptr) {
        if (options.average_attn_weights) {
            per_head = TensorView(ensure(ws.head_weights, Shape{B, h, Lq, Lkx}), DType::f32, Shape{B, h, Lq, Lkx});
        } else {
            per_head = TensorView(weights->data(), DType::f32, Shape{B, h, Lq, Lkx});
        }
    }
    sdpa(Q, K, V, so, O, nullptr, weights != nullptr ? &per_head : nullptr);

    // ---- out projection straight into the output (same row order as the query) ----
    detail::linear(o, Nq, E, E, parameter("out_proj.weight").data_as<const float>(), E,
                   c.bias ? parameter("out_proj.bias").data_as<const float>() : nullptr, output.data_as<float>(), E);

    if (weights != nullptr && options.average_attn_weights) {
        // PyTorch: weights.view(B, h, Lq, Lk).mean(dim=1)
        const float* src = per_head.data_as<const float>();
        float* dst = weights->data_as<float>();
        const std::int64_t plane = Lq * Lkx;
        const float inv = 1.0f / static_cast<float>(h);
#pragma omp parallel for schedule(static)
        for (std::int64_t b = 0; b < B; ++b) {
            float* d = dst + b * plane;
            std::memcpy(d, src + b * h * plane, static_cast<std::size_t>(plane) * sizeof(float));
            for (std::int64_t j = 1; j < h; ++j) {
                const float* s = src + (b * h + j) * plane;
                for (std::int64_t x = 0; x < plane; ++x) d[x] += s[x];
            }
            for (std::int64_t x = 0; x < plane; ++x) d[x] *= inv;
        }
    }
}

}  // namespace attn
