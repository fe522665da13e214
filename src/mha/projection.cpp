#include "projection.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../core/check.hpp"
#include "../kernels/store_row.hpp"
#include "linear.hpp"
#include "packed_weights.hpp"

namespace attn::detail {

void* ensure(Tensor& t, DType dt, const Shape& shape, const char* what) {
    if (t.data() == nullptr || t.dtype() != dt || !(t.shape() == shape)) t = Tensor(dt, shape, false, what);
    return t.data();
}

float* ensure(Tensor& t, const Shape& shape, const char* what) { return static_cast<float*>(ensure(t, DType::f32, shape, what)); }

namespace {
bool gemm_dtype(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16; }
}  // namespace

Operand as_rows(const TensorView& x, Tensor& copy, const char* what) {
    if (gemm_dtype(x.dtype()) && x.is_contiguous()) return Operand(x.data(), x.dtype());
    copy = to_dtype(x, gemm_dtype(x.dtype()) ? x.dtype() : DType::f32, what);
    return Operand(copy.data(), copy.dtype());
}

DType output_dtype(const std::optional<DType>& requested, DType input) {
    if (requested) {
        if (!gemm_dtype(*requested)) {
            fail_type(kMha, "out_dtype: expected float32, float16 or bfloat16 but got ", dtype_name(*requested));
        }
        return *requested;
    }
    return input == DType::f16 || input == DType::bf16 ? input : DType::f32;
}

DType intermediate_dtype(const std::optional<DType>& requested) {
    if (!requested) return DType::f32;
    if (!gemm_dtype(*requested)) {
        fail_type(kMha, "intermediate_dtype: expected float32, float16 or bfloat16 but got ", dtype_name(*requested));
    }
    return *requested;
}

Projected round_projected(const Projected& p, DType dt, MhaWorkspace& ws) {
    const Tensor* const buffers[3] = {&ws.proj_q, &ws.proj_kv, &ws.proj_v};
    bool rounded[3] = {false, false, false};
    auto rebase = [&](const TensorView& v) {
        const auto at_address = reinterpret_cast<std::uintptr_t>(v.data());
        for (int i = 0; i < 3; ++i) {
            const Tensor& src = *buffers[i];
            const auto begin = reinterpret_cast<std::uintptr_t>(src.data());
            if (src.data() == nullptr || at_address < begin || at_address >= begin + src.nbytes()) continue;
            Tensor& twin = ws.proj16[i];
            ensure(twin, dt, src.shape(), "the MHA layer's 16-bit projections");
            if (!rounded[i]) {
                store_output(src.data_as<const float>(), twin.view());  // the one rounding rule, over the threads
                rounded[i] = true;
            }
            const std::size_t element = (at_address - begin) / sizeof(float);
            return TensorView(static_cast<char*>(twin.data()) + element * dtype_size(dt), dt, v.shape(), v.strides());
        }
        fail(kMha, "internal: a projected view outside the layer's workspace buffers");
    };
    return Projected{rebase(p.Q), rebase(p.K), rebase(p.V)};
}

void store_output(const float* src, const TensorView& out) {
    const std::int64_t n = out.numel();
    if (out.dtype() == DType::f32) {
        if (out.data() != src) std::memcpy(out.data(), src, static_cast<std::size_t>(n) * sizeof(float));
        return;
    }
    // Rounded in row-sized pieces over the threads (the one rounding rule: store_row).
    const std::int64_t piece = 4096, pieces = (n + piece - 1) / piece;
#pragma omp parallel for schedule(static)
    for (std::int64_t p = 0; p < pieces; ++p) {
        const std::int64_t begin = p * piece;
        store_row(out, begin, 1, src + begin, 1, std::min(piece, n - begin), 1.0f);
    }
}

Tensor rounded_rows(Tensor rows, DType dt) {
    if (dt == DType::f32) return rows;
    Tensor narrow(dt, rows.shape());
    store_output(rows.data_as<const float>(), narrow.view());
    return narrow;
}

void check_output(const char* name, const TensorView& out, const Shape& shape, bool float32_only) {
    const bool dtype_ok = float32_only ? out.dtype() == DType::f32 : gemm_dtype(out.dtype());
    if (out.data() == nullptr || !dtype_ok || !out.is_contiguous() || !(out.shape() == shape)) {
        // Say which requirement failed: a strided view of the right dtype and shape was told it
        // had "float32 (2, 37, 37)" where that was expected.
        // A TypeError in Python when the dtype is what is wrong (ErrorKind).
        fail_as(out.data() == nullptr || dtype_ok ? ErrorKind::value : ErrorKind::type, kMha, name, ": expected a contiguous ",
                float32_only ? "float32" : "float32, float16 or bfloat16", " tensor of shape ", shape, " but got ",
                dtype_name(out.dtype()), " ", out.shape(), out.data() == nullptr ? " with a null data pointer" : "",
                out.is_contiguous() ? "" : " with strides " + strides_text(out) + " (non-contiguous)");
    }
}

const PackedB* packed_matrix(const MultiHeadAttention& layer, bool use_packed, const char* name) {
    const PackedWeights* pw = use_packed ? layer.packed_weights() : nullptr;
    return pw != nullptr ? pw->find(name) : nullptr;
}

InputWeights input_weights(const MultiHeadAttention& layer, bool use_packed) {
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim, Ekv = c.num_kv_heads * layer.head_dim();
    auto p = [&](const char* name) {
        const TensorView t = layer.parameter(name);
        Operand o(t.data(), t.dtype());
        o.packed = packed_matrix(layer, use_packed, name);
        return o;
    };
    InputWeights w;
    w.packed = c.kdim == E && c.vdim == E;  // in_proj_weight holds W_Q, W_K, W_V
    w.wq = w.packed ? p("in_proj_weight") : p("q_proj_weight");
    w.wk = w.packed ? w.wq.offset(E * E) : p("k_proj_weight");
    w.wv = w.packed ? w.wk.offset(Ekv * E) : p("v_proj_weight");
    if (c.bias) {
        w.bias = w.bq = layer.parameter("in_proj_bias").data_as<const float>();
        w.bk = w.bias + E;
        w.bv = w.bias + E + Ekv;
    }
    return w;
}

Operand out_weight(const MultiHeadAttention& layer, bool use_packed) {
    const TensorView t = layer.parameter("out_proj.weight");
    Operand o(t.data(), t.dtype());
    o.packed = packed_matrix(layer, use_packed, "out_proj.weight");
    return o;
}

Projected project_qkv(const MultiHeadAttention& layer, const MhaShapes& s, Operand xq, Operand xk, Operand xv,
                      ProjectionPlan plan, MhaWorkspace& ws) {
    const MhaConfig& c = layer.config();
    const std::int64_t E = c.embed_dim, h = c.num_heads, hkv = c.num_kv_heads, dh = layer.head_dim(), Ekv = hkv * dh;
    const std::int64_t B = s.B, Lq = s.Lq, Lk = s.Lk, Lkx = s.Lkx, Nq = B * Lq, Nk = B * Lk;
    const InputWeights w = input_weights(layer, plan.use_packed);
    // A buffer of `rows` rows and `heads` heads of d_h columns, written by one GEMM whose
    // output begins at head `first`: its shape, how the GEMM stores it and reads its input (of
    // row stride ld, rows r: head-major rows are batch-major, head_layout.hpp), and the views of it.
    const bool hm = plan.head_major;
    const auto shape = [&](std::int64_t rows, std::int64_t heads) { return hm ? Shape{heads, rows, dh} : Shape{rows, heads * dh}; };
    const auto blocks = [&](std::int64_t rows) { return hm ? head_major_blocks(rows, dh) : ColumnBlocks{}; };
    const auto read = [&](Rows r, std::int64_t L, std::int64_t ld) { return hm ? head_major_read(r, L, ld) : InputRead{ld, {}}; };
    const auto view = [&](float* buf, std::int64_t rows, std::int64_t ld, std::int64_t first, Rows r, std::int64_t heads,
                          std::int64_t L) {
        return hm ? head_major_view(buf, rows, first, B, heads, L, dh) : heads_view(buf, ld, first * dh, r, B, heads, L, dh);
    };
    Projected p;
    if (plan.self_attention && w.packed && !plan.batch_major) {
        // One GEMM X (N, E) · [W_Q; W_K; W_V]ᵀ → (N, E + 2·E_kv), i.e. per row (3, h, d_h)
        // without GQA (head-major: h + 2·h_kv matrices of (N, d_h)); Q, K and V are views of it.
        const std::int64_t n = E + 2 * Ekv;
        float* qkv = ensure(ws.proj_q, shape(Nq, h + 2 * hkv), "the MHA layer's projected Q, K and V");
        const InputRead x = read(s.rq, Lq, E);
        linear(xq, Nq, E, x.ldx, w.wq, n, w.bias, qkv, hm ? dh : n, blocks(Nq), x.groups);
        p.Q = view(qkv, Nq, n, 0, s.rq, h, Lq);
        p.K = view(qkv, Nq, n, h, s.rk, hkv, Lk);
        p.V = view(qkv, Nq, n, h + hkv, s.rk, hkv, Lk);
        return p;
    }
    float* q = ensure(ws.proj_q, shape(Nq, h), "the MHA layer's projected Q");
    const InputRead x = read(s.rq, Lq, E);
    linear(xq, Nq, E, x.ldx, w.wq, E, w.bq, q, hm ? dh : E, blocks(Nq), x.groups);
    p.Q = view(q, Nq, E, 0, s.rq, h, Lq);
    if (plan.batch_major) {
        // One GEMM per batch item into (B, Lkx, E_kv) buffers, then the appended rows (never
        // head-major: the backward reads these rows). Rows of item b in the input: b·rb + l·rl.
        float* k = ensure(ws.proj_kv, Shape{B * Lkx, Ekv}, "the MHA layer's projected K");
        float* v = ensure(ws.proj_v, Shape{B * Lkx, Ekv}, "the MHA layer's projected V");
        const float* bias_k = c.add_bias_kv ? layer.parameter("bias_k").data_as<const float>() : nullptr;
        const float* bias_v = c.add_bias_kv ? layer.parameter("bias_v").data_as<const float>() : nullptr;
        const std::size_t bytes = static_cast<std::size_t>(Ekv) * sizeof(float);
        for (std::int64_t b = 0; b < B; ++b) {
            linear(xk.offset(b * s.rk.rb * c.kdim), Lk, c.kdim, s.rk.rl * c.kdim, w.wk, Ekv, w.bk, k + b * Lkx * Ekv, Ekv);
            linear(xv.offset(b * s.rk.rb * c.vdim), Lk, c.vdim, s.rk.rl * c.vdim, w.wv, Ekv, w.bv, v + b * Lkx * Ekv, Ekv);
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
        float* kv = ensure(ws.proj_kv, shape(Nk, 2 * hkv), "the MHA layer's projected K and V");
        const InputRead xkr = read(s.rk, Lk, E);
        linear(xk, Nk, E, xkr.ldx, w.wk, 2 * Ekv, w.bk, kv, hm ? dh : 2 * Ekv, blocks(Nk), xkr.groups);
        p.K = view(kv, Nk, 2 * Ekv, 0, s.rk, hkv, Lk);
        p.V = view(kv, Nk, 2 * Ekv, hkv, s.rk, hkv, Lk);
    } else {
        float* k = ensure(ws.proj_kv, shape(Nk, hkv), "the MHA layer's projected K");
        float* v = ensure(ws.proj_v, shape(Nk, hkv), "the MHA layer's projected V");
        const InputRead xkr = read(s.rk, Lk, c.kdim), xvr = read(s.rk, Lk, c.vdim);
        linear(xk, Nk, c.kdim, xkr.ldx, w.wk, Ekv, w.bk, k, hm ? dh : Ekv, blocks(Nk), xkr.groups);
        linear(xv, Nk, c.vdim, xvr.ldx, w.wv, Ekv, w.bv, v, hm ? dh : Ekv, blocks(Nk), xvr.groups);
        p.K = view(k, Nk, Ekv, 0, s.rk, hkv, Lk);
        p.V = view(v, Nk, Ekv, 0, s.rk, hkv, Lk);
    }
    return p;
}

}  // namespace attn::detail
