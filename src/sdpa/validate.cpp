// Argument checks for attn::sdpa, in one place. Every message names the argument,
// what was expected and what was given; nothing is written before they all pass.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "../core/check.hpp"
#include "problem.hpp"

namespace attn::detail {
namespace {

bool is_compute_float(DType t) { return t == DType::f32 || t == DType::f64; }

// Q, K, V and out may be float32, float64, float16 or bfloat16 (any combination:
// require_floating); which kernel reads which is decided in kernels/dispatch.cpp, which says
// why when one declines.

// An output: rank, float dtype (16-bit only where `sixteen_ok`: out, not lse or weights),
// exact shape, one address per element — unless the call reads it (a backward's out and lse).
void require_output(std::string_view kOp, const TensorView& t, const char* name, const Shape& expected, const char* layout,
                    bool sixteen_ok = false, OutLse role = OutLse::written) {
    require_rank(kOp, t, name, expected.rank, layout);
    if (sixteen_ok) require_floating(kOp, t, name);
    else require_f32_or_f64(kOp, t, name);
    require_shape(kOp, t, name, expected, layout);
    if (role == OutLse::written) require_distinct_elements(kOp, t, name);
}

// Offsets up to 2^60 keep every diagonal ± window bound far from the int64 limits.
constexpr std::int64_t kMaxQueryOffset = std::int64_t{1} << 60;

// One query offset (the scalar, or entry b of the per-sequence ones): within ±2^60.
void check_query_offset(std::string_view kOp, std::int64_t off, const std::string& where) {
    if (off < -kMaxQueryOffset || off > kMaxQueryOffset) fail(kOp, "query_offset: ", where, "must be in [-2^60, 2^60] but got ", off);
}

// softcap, alibi_slopes, sinks (docs/conventions.md, "Score modifiers").
void check_modifiers(std::string_view kOp, const SdpaOptions& o, SdpaProblem& p) {
    p.softcap = o.softcap;  // its range: check_option_values
    if (o.alibi_slopes) {
        const TensorView& a = *o.alibi_slopes;
        const bool per_head = a.rank() == 1 && a.dim(0) == p.Hq;
        const bool per_seq = a.rank() == 2 && a.dim(0) == p.B && a.dim(1) == p.Hq;
        if (!per_head && !per_seq)
            fail(kOp, "alibi_slopes: shape must be (Hq,) = (", p.Hq, ",) or (B, Hq) = (", p.B, ", ", p.Hq,
                 ") but got ", a.shape());
        require_finite_f32(kOp, a, "alibi_slopes");
        p.alibi_slopes = a.broadcast_to(Shape{p.B, p.Hq}, std::string(kOp) + ": alibi_slopes");
    }
    if (o.sinks) {
        const TensorView& s = *o.sinks;
        if (!(s.rank() == 1 && s.dim(0) == p.Hq))
            fail(kOp, "sinks: shape must be (Hq,) = (", p.Hq, ",) but got ", s.shape());
        require_finite_f32(kOp, s, "sinks");
        p.sinks = s;
    }
}

}  // namespace

void require_finite_f32(std::string_view kOp, const TensorView& t, const char* name) {
    if (t.data() == nullptr) fail(kOp, name, ": data pointer is null");
    if (t.dtype() != DType::f32) fail_type(kOp, name, ": dtype must be float32 but got ", dtype_name(t.dtype()));
    require_element_aligned(kOp, t, name);
    const float* d = t.data_as<const float>();
    const std::int64_t rows = t.rank() == 2 ? t.dim(0) : 1, cols = t.dim(t.rank() - 1);
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
            const float x = d[t.rank() == 2 ? t.offset(r, c) : t.offset(c)];
            if (!std::isfinite(x)) {
                if (t.rank() == 2) fail(kOp, name, ": values must be finite but entry (", r, ", ", c, ") is ", x);
                fail(kOp, name, ": values must be finite but entry ", c, " is ", x);
            }
        }
}

TensorView require_query_offsets(std::string_view kOp, const TensorView& offsets, std::int64_t n, std::string_view count) {
    const TensorView qo = require_per_sequence(kOp, offsets, "query_offset", n, count);
    for (std::int64_t b = 0; b < n; ++b) check_query_offset(kOp, load_int(qo, qo.offset(b)), "entry " + std::to_string(b) + " ");
    return qo;
}

void check_option_values(const SdpaOptions& options, std::string_view kOp) {
    require_enum(kOp, "impl", options.impl, 4, "Impl::automatic, reference, flash, decode");
    require_enum(kOp, "causal", options.causal, 3, "Causal::none, top_left, bottom_right");
    require_enum(kOp, "window.align", options.window.align, 2, "Align::top_left, bottom_right");
    if (options.scale) {
        // The value every fast kernel multiplies by is the float32 one: it must mean what the
        // caller gave. 1e39 is finite as a double but inf as a float (scores ±inf or NaN); 1e-50
        // is non-zero as a double but 0 as a float (every score 0: uniform weights, silently); 1e-40
        // is a float32 subnormal, which holds the scale with fewer bits the smaller it is (17 there:
        // relative error 5.4e-6, not float32's 6e-8). So a normal float32 or 0, as softcap
        // (docs/conventions.md, "Shapes of attn::sdpa").
        const double s = *options.scale;
        const float f = static_cast<float>(s);
        if (!std::isfinite(s) || !std::isfinite(f)) {
            fail(kOp, "scale: must be finite in float32 (|scale| <= 3.4028235e38) but got ", shortest(s));
        }
        if (s != 0.0 && !std::isnormal(f)) {
            fail(kOp, "scale: must be 0 or a normal float32 (|scale| >= 2^-126 ≈ 1.1754944e-38 there) but got ", shortest(s),
                 f == 0.0f ? ", which rounds to 0" : ", a float32 subnormal");
        }
    }
    if (options.query_offset && !options.query_offset->per_sequence)
        check_query_offset(kOp, options.query_offset->value, "");
    if (options.window.left < -1 || options.window.right < -1) {
        fail(kOp, "window: left and right must be >= 0, or -1 for unbounded, but got left=", options.window.left,
             " right=", options.window.right);
    }
    require_dropout(kOp, options.dropout_p, options.dropout_seed);
    require_softcap(options.softcap, kOp);
}

void require_softcap(double softcap, std::string_view kOp) {
    if (softcap == 0.0) return;
    // Kernels compute s·(1/c) and c·tanh in float32: c must be a normal float32.
    const double kMin = static_cast<double>(std::numeric_limits<float>::min());
    const double kMax = static_cast<double>(std::numeric_limits<float>::max());
    if (!(softcap >= kMin && softcap <= kMax))
        fail(kOp, "softcap: must be 0 (off) or a finite float32 in [1.1754944e-38, 3.4028235e38] but got ", shortest(softcap));
}

// Q, K or V: every dim >= 1 unless `zero` allows 0 (empty inputs are refused: docs/torch.md,
// "Empty inputs"), rank 4, a float dtype. The size comes first: an empty tensor's data pointer may
// be null (nothing to point at), and the user must hear of the zero dim or a wrong rank, not of
// the pointer — or, where size 0 is allowed, hear nothing: the tensor is never read.
static void check_input(std::string_view kOp, const TensorView& t, const char* name, const char* layout, SizeZero zero) {
    const char* names[] = {"batch", "heads", "length", "head dim"};
    if (t.rank() == 4 && zero == SizeZero::refused)
        for (int i = 0; i < 4; ++i)
            if (t.dim(i) < 1) fail(kOp, name, ": ", names[i], " must be >= 1 but got ", t.dim(i));
    require_rank(kOp, t, name, 4, layout, NullData::allowed_if_empty);
    require_floating(kOp, t, name);
}

void check_qkv(const TensorView& q, const TensorView& k, const TensorView& v, SdpaProblem& p, std::string_view kOp,
               SizeZero zero) {
    check_input(kOp, q, "Q", "(B, Hq, Lq, Dk)", zero);
    check_input(kOp, k, "K", "(B, Hkv, Lk, Dk)", zero);
    check_input(kOp, v, "V", "(B, Hkv, Lk, Dv)", zero);

    p.B = q.dim(0);
    p.Hq = q.dim(1);
    p.Lq = q.dim(2);
    p.Dk = q.dim(3);
    p.Hkv = k.dim(1);
    p.Lk = k.dim(2);
    p.Dv = v.dim(3);

    if (k.dim(0) != p.B) fail(kOp, "K: batch ", k.dim(0), " does not match Q's batch ", p.B);
    if (v.dim(0) != p.B) fail(kOp, "V: batch ", v.dim(0), " does not match Q's batch ", p.B);
    if (k.dim(3) != p.Dk) fail(kOp, "K: head dim ", k.dim(3), " does not match Q's head dim ", p.Dk);
    if (v.dim(1) != p.Hkv) fail(kOp, "V: heads ", v.dim(1), " do not match K's heads ", p.Hkv);
    if (v.dim(2) != p.Lk) fail(kOp, "V: length ", v.dim(2), " does not match K's length ", p.Lk);
    // Hkv = 0 only where SizeZero::allowed: a multiple of 0 is 0.
    if (p.Hkv == 0 ? p.Hq != 0 : p.Hq % p.Hkv != 0) {
        fail(kOp, "Q: heads ", p.Hq, " must be a multiple of K/V's heads ", p.Hkv, " (grouped-query attention)");
    }
    p.group = p.Hkv == 0 ? 1 : p.Hq / p.Hkv;
}

SdpaProblem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                         const SdpaOptions& options, const TensorView& out, const TensorView* lse,
                         const TensorView* weights, std::string_view kOp, OutLse out_lse, SizeZero zero) {
    SdpaProblem p;
    p.op = kOp;
    check_qkv(q, k, v, p, kOp, zero);
    require_output(kOp, out, "out", Shape{p.B, p.Hq, p.Lq, p.Dv}, "(B, Hq, Lq, Dv)", true, out_lse);
    if (lse != nullptr) {
        require_output(kOp, *lse, "lse", Shape{p.B, p.Hq, p.Lq}, "(B, Hq, Lq)", false, out_lse);
        p.lse = *lse;
    }
    if (weights != nullptr) {
        require_output(kOp, *weights, "weights", Shape{p.B, p.Hq, p.Lq, p.Lk}, "(B, Hq, Lq, Lk)");
        p.weights = *weights;
    }

    check_option_values(options, kOp);
    if (options.scale) {
        p.scale = *options.scale;
    } else {
        p.scale = 1.0 / std::sqrt(static_cast<double>(p.Dk));
    }

    const Shape full{p.B, p.Hq, p.Lq, p.Lk};
    if (options.bool_mask) {
        const TensorView& m = *options.bool_mask;
        if (m.data() == nullptr) fail(kOp, "bool_mask: data pointer is null");
        if (m.dtype() != DType::boolean) {
            fail_type(kOp, "bool_mask: dtype must be bool (true = may attend) but got ", dtype_name(m.dtype()));
        }
        p.bool_mask = m.broadcast_to(full, std::string(kOp) + ": bool_mask");
    }
    if (options.additive_mask) {
        const TensorView& m = *options.additive_mask;
        if (m.data() == nullptr) fail(kOp, "additive_mask: data pointer is null");
        if (!is_floating(m.dtype())) {
            fail_type(kOp, "additive_mask: dtype must be float32, float64, float16 or bfloat16 but got ", dtype_name(m.dtype()));
        }
        require_element_aligned(kOp, m, "additive_mask");
        const TensorView mb = m.broadcast_to(full, std::string(kOp) + ": additive_mask");  // checks the shape first
        if (is_compute_float(m.dtype())) {
            p.additive_mask = mb;
        } else {
            // float16/bfloat16 (a 16-bit model's mask, as torch passes it): widened once, exactly, to
            // float32. Only the mask's own elements are copied: a dim it broadcasts stays stride 0.
            Shape own = m.shape();
            for (int d = 0; d < own.rank; ++d)
                if (m.stride(d) == 0) own.dims[static_cast<std::size_t>(d)] = 1;
            p.additive_mask_f32 = std::make_shared<const Tensor>(to_dtype(TensorView(m.data(), m.dtype(), own, m.strides()), DType::f32));
            p.additive_mask = p.additive_mask_f32->view().broadcast_to(full, std::string(kOp) + ": additive_mask");
        }
    }
    if (options.key_lengths) {
        const TensorView kl = require_per_sequence(kOp, *options.key_lengths, "key_lengths", p.B);
        for (std::int64_t b = 0; b < p.B; ++b) {
            const std::int64_t len = load_int(kl, kl.offset(b));
            if (len < 0 || len > p.Lk) fail(kOp, "key_lengths: entry ", b, " must be in [0, Lk=", p.Lk, "] but got ", len);
        }
        p.key_lengths = kl;
    }
    // The largest |diagonal offset| an explicit query_offset brings (bottom-right's n_b − Lq
    // is within Lq + Lk already).
    std::int64_t max_offset = 0;
    if (options.query_offset) {
        const QueryOffset& qo = *options.query_offset;
        p.has_query_offset = true;
        if (qo.per_sequence) {
            p.query_offsets = require_query_offsets(kOp, *qo.per_sequence, p.B);
            for (std::int64_t b = 0; b < p.B; ++b)
                max_offset = std::max(max_offset, std::abs(load_int(*p.query_offsets, p.query_offsets->offset(b))));
        } else {  // its range: check_option_values, above
            max_offset = std::abs(qo.value);
            p.query_offset_value = qo.value;
        }
    }
    p.dropout_p = options.dropout_p;
    p.dropout_seed = options.dropout_seed.value_or(0);  // read only when dropout_p > 0, where it is given
    {
        // The origin plus the call's extent must stay inside the Philox counter's 32-bit words.
        const DropoutOrigin& o = options.dropout_origin;
        constexpr std::int64_t k32 = std::int64_t{1} << 32;
        const struct {
            const char* name;
            std::int64_t at, extent, limit;
            const char* extent_name;
            const char* tensor;
        } parts[] = {{"batch", o.batch, p.B, k32, "B", "Q"}, {"head", o.head, p.Hq, k32, "Hq", "Q"},
                     {"row", o.row, p.Lq, k32, "Lq", "Q"}, {"key", o.key, p.Lk, 4 * k32, "Lk", "K"}};
        for (const auto& x : parts) {
            // Every call keeps to the counter's range, with dropout or without (a broadcast K of
            // 2^34 + 1 keys was refused in the name of a dropout_origin nobody had set).
            if (x.extent > x.limit) {
                fail(kOp, x.tensor, ": ", x.extent_name, " = ", x.extent, " is more than a call may have (",
                     x.limit == k32 ? "2^32" : "2^34", ", the range of the dropout counter, with or without dropout)");
            }
            if (x.at < 0 || x.at > x.limit - x.extent) {
                fail(kOp, "dropout_origin.", x.name, ": must be >= 0 with ", x.name, " + ", x.extent_name, " <= ",
                     x.limit == k32 ? "2^32" : "2^34", " (", x.extent_name, " = ", x.extent, ") but got ", x.at);
            }
        }
        p.dropout_origin = o;
    }
    check_modifiers(kOp, options, p);
    p.causal = options.causal;
    p.window = options.window;
    // A bound that excludes no key is stored as unbounded, so key_range never computes
    // d + right + 1 or d − left near the int64 limits: |j − d_b(i)| < Lk + Lq + |offset_b|
    // for every key j, query i and diagonal offset (top-left 0, bottom-right n_b − Lq, or
    // the explicit query_offset).
    const std::int64_t reach = p.Lq + p.Lk + max_offset;
    if (p.window.left >= reach) p.window.left = -1;
    if (p.window.right >= reach) p.window.right = -1;
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    p.bf16_products = asks_bf16_products(q.dtype(), k.dtype(), v.dtype(), out.dtype());
    return p;
}

std::vector<Named> with_option_tensors(std::vector<Named> inputs, const SdpaOptions& o) {
    const TensorView* query_offsets = o.query_offset ? view_or_null(o.query_offset->per_sequence) : nullptr;
    inputs.insert(inputs.end(), {{view_or_null(o.bool_mask), "bool_mask"}, {view_or_null(o.additive_mask), "additive_mask"},
                                 {view_or_null(o.key_lengths), "key_lengths"}, {query_offsets, "query_offset"},
                                 {view_or_null(o.alibi_slopes), "alibi_slopes"}, {view_or_null(o.sinks), "sinks"}});
    return inputs;
}

void require_backward_gradients(std::string_view kOp, const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const TensorView& lse, const TensorView& grad_out,
                                const SdpaOptions& options, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const TensorView* dsinks, std::int64_t Hq) {
    require_gradient_like(kOp, grad_out, "grad_out", out.shape(), "out");
    require_gradient_like(kOp, dq, "dq", q.shape(), "q");
    require_gradient_like(kOp, dk, "dk", k.shape(), "k");
    require_gradient_like(kOp, dv, "dv", v.shape(), "v");
    require_gradient_outputs(kOp,
                             with_option_tensors({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"},
                                                  {&grad_out, "grad_out"}}, options),
                             {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}}, dsinks, view_or_null(options.sinks), Hq);
}

void require_outputs_apart(std::string_view kOp, std::vector<Named> inputs, const SdpaOptions& o,
                           const std::vector<Named>& outputs) {
    require_apart(kOp, with_option_tensors(std::move(inputs), o), outputs);
}

void require_outputs_apart(const SdpaProblem& p, const SdpaOptions& o, std::string_view kOp) {
    require_outputs_apart(kOp, {{&p.q, "Q"}, {&p.k, "K"}, {&p.v, "V"}}, o,
                          {{&p.out, "out"}, {view_or_null(p.lse), "lse"}, {view_or_null(p.weights), "weights"}, {view_or_null(p.scores), "scores"}});
}

void attach_scores(SdpaProblem& p, const ScoresOutput& s, std::string_view kOp) {
    require_enum(kOp, "scores.stage", s.stage, 3, "ScoreStage::scaled, softcapped, masked");
    require_output(kOp, s.view, "scores", Shape{p.B, p.Hq, p.Lq, p.Lk}, "(B, Hq, Lq, Lk)");
    if (p.dropout_p > 0.0)
        fail(kOp, "scores: not available together with dropout (dropout_p = ", shortest(p.dropout_p),
             "): the scores are those of the undropped softmax's input; run without dropout");
    p.scores = s.view;
    p.scores_stage = s.stage;
}

}  // namespace attn::detail
