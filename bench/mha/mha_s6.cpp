#include "mha_s6.hpp"

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "mha/head_layout.hpp"
#include "mha/linear.hpp"
#include "mha/packed_weights.hpp"
#include "openblas.hpp"
#include "attn/threads.hpp"

namespace attn::bench {

struct MhaS6::Buffers {
    std::unique_ptr<MultiHeadAttention> layer;
    MhaWorkspace ws;
    Tensor x, out;     // the layer's input and output (B, L, E)
    Tensor qkv, o;     // the parts' own buffers: head-major (3h, B·L, d_h) and (B·L, E)
    Tensor sa, sb, sc; // square GEMM operands (n, n)
    TensorView q, k, v, ov;
    std::string kernel;
};

namespace {
void fill(Tensor& t, std::mt19937& rng, float scale) {
    std::normal_distribution<float> n(0.0f, scale);
    float* const p = t.data_as<float>();
    const std::int64_t count = t.numel();  // checked once: Shape::numel checks for overflow on every call
    for (std::int64_t i = 0; i < count; ++i) p[i] = n(rng);
}
}  // namespace

MhaS6::MhaS6(const MhaS6Shape& s) : shape_(s), b_(std::make_unique<Buffers>()) {
    // x: (B, L, E) batch_first; weights random, scaled like PyTorch's init (1/sqrt(E)).
    std::mt19937 rng(6);
    const std::int64_t N = s.B * s.L, E = s.E, dh = s.E / s.h;
    b_->layer = std::make_unique<MultiHeadAttention>(
        MhaConfig{.embed_dim = E, .num_heads = s.h, .batch_first = true, .param_dtype = s.dtype});
    std::vector<Tensor> params;
    std::vector<std::pair<std::string, TensorView>> sd;
    for (const auto& [name, shape] : b_->layer->parameter_shapes()) {
        params.emplace_back(DType::f32, shape);
        fill(params.back(), rng, 1.0f / std::sqrt(static_cast<float>(E)));
        sd.emplace_back(name, params.back().view());
    }
    b_->layer->load_state_dict(sd);
    b_->layer->pack_weights();  // inference: the weights' GEMM panels are packed once (mha.hpp)
    b_->x = Tensor(DType::f32, Shape{s.B, s.L, E});
    fill(b_->x, rng, 1.0f);
    if (s.dtype != DType::f32) b_->x = to_dtype(b_->x.view(), s.dtype);  // (the weights round on load)
    b_->out = Tensor(s.dtype, Shape{s.B, s.L, E}, true);
    b_->qkv = Tensor(DType::f32, Shape{3 * s.h, N, dh}, true);
    b_->o = Tensor(DType::f32, Shape{N, E}, true);
    // The views the layer hands to sdpa (src/mha/head_layout.hpp): Q, K, V head-major — head k
    // of the QKV GEMM's (which, head) a (B·L, d_h) matrix at k·B·L·d_h, row b·L + l —, O row
    // b·L + l of (B·L, E), columns (head, d).
    float* qkv = b_->qkv.data_as<float>();
    b_->q = detail::head_major_view(qkv, N, 0, s.B, s.h, s.L, dh);
    b_->k = detail::head_major_view(qkv, N, s.h, s.B, s.h, s.L, dh);
    b_->v = detail::head_major_view(qkv, N, 2 * s.h, s.B, s.h, s.L, dh);
    b_->ov = TensorView(b_->o.data_as<float>(), DType::f32, Shape{s.B, s.h, s.L, dh}, Strides{s.L * E, dh, E, 1});

    // Square GEMM with the QKV GEMM's FLOPs: 2n³ = 2·N·E·3E.
    square_n_ = static_cast<std::int64_t>(std::llround(std::cbrt(static_cast<double>(N) * E * 3 * E)));
    // (Only the float32 layer has parts: a 16-bit layer's row would otherwise carry 27 MB of
    // square operands it never uses in its peak memory.)
    if (s.dtype == DType::f32)
        for (Tensor* t : {&b_->sa, &b_->sb, &b_->sc}) {
            *t = Tensor(DType::f32, Shape{square_n_, square_n_});
            fill(*t, rng, 1.0f);
        }
    forward();  // touches the workspace once
}

MhaS6::~MhaS6() = default;

void MhaS6::forward() {
    MhaForwardOptions o;
    o.need_weights = false;
    o.impl = shape_.impl;
    o.intermediate_dtype = shape_.intermediate_dtype;
    b_->layer->forward_into(b_->x, b_->x, b_->x, o, b_->out, nullptr, &b_->ws);
}

namespace {
// A weight matrix as the layer's forward passes it to the GEMM: with its pre-packed panels.
detail::Operand packed_weight(const MultiHeadAttention& m, const char* name) {
    detail::Operand w(m.parameter(name).data_as<const float>());
    w.packed = m.packed_weights()->find(name);
    return w;
}
}  // namespace

void MhaS6::qkv_projection() {
    const std::int64_t N = shape_.B * shape_.L, E = shape_.E, dh = E / shape_.h;
    detail::linear(b_->x.data_as<float>(), N, E, E, packed_weight(*b_->layer, "in_proj_weight"), 3 * E,
                   b_->layer->parameter("in_proj_bias").data_as<float>(), b_->qkv.data_as<float>(), dh,
                   detail::head_major_blocks(N, dh));
}

void MhaS6::attention() {
    SdpaOptions o;
    o.impl = shape_.impl;
    SdpaReport r;
    sdpa(b_->q, b_->k, b_->v, o, b_->ov, nullptr, nullptr, &r);
    b_->kernel = r.kernel;
}

void MhaS6::out_projection() {
    const std::int64_t N = shape_.B * shape_.L, E = shape_.E;
    detail::linear(b_->o.data_as<float>(), N, E, E, packed_weight(*b_->layer, "out_proj.weight"), E,
                   b_->layer->parameter("out_proj.bias").data_as<float>(), b_->out.data_as<float>(), E);
}

void MhaS6::square_gemm() {
    const std::int64_t n = square_n_;
    detail::gemm(false, false, n, n, n, b_->sa.data_as<float>(), n, b_->sb.data_as<float>(), n, 0.0f,
                 b_->sc.data_as<float>(), n);
}

void MhaS6::square_gemm_openblas() {
    const int n = static_cast<int>(square_n_);
    openblas_sgemm(false, false, n, n, n, b_->sa.data_as<float>(), n, b_->sb.data_as<float>(), n,
                   b_->sc.data_as<float>(), n, num_threads());
}

void MhaS6::qkv_gemm_openblas() {
    const int N = static_cast<int>(shape_.B * shape_.L), E = static_cast<int>(shape_.E);
    openblas_sgemm(false, true, N, 3 * E, E, b_->x.data_as<float>(), E,
                   b_->layer->parameter("in_proj_weight").data_as<float>(), E, b_->qkv.data_as<float>(), 3 * E,
                   num_threads());
}

double MhaS6::flop_qkv() const { return 2.0 * static_cast<double>(shape_.B * shape_.L) * shape_.E * 3.0 * shape_.E; }
double MhaS6::flop_out() const { return 2.0 * static_cast<double>(shape_.B * shape_.L) * shape_.E * shape_.E; }
double MhaS6::flop_attention() const {
    return 4.0 * static_cast<double>(shape_.B) * shape_.h * shape_.L * shape_.L * (shape_.E / shape_.h);
}
double MhaS6::flop_square() const { return 2.0 * std::pow(static_cast<double>(square_n_), 3.0); }
std::string MhaS6::attention_kernel() const { return b_->kernel; }

}  // namespace attn::bench
