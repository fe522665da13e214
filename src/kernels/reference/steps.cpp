#include <algorithm>

#include "attn/reference.hpp"
#include "reference.hpp"

namespace attn {

AttentionSteps reference_steps(const TensorView& q, const TensorView& k, const TensorView& v,
                               const SdpaOptions& options) {
    constexpr std::string_view kOp = "reference_steps";
    // Q, K and V checked before any buffer is sized from them; then the whole problem, with the
    // output it fills.
    detail::SdpaProblem shapes;
    detail::check_qkv(q, k, v, shapes, kOp);
    const std::int64_t B = shapes.B, Hq = shapes.Hq, Lq = shapes.Lq, Lk = shapes.Lk, Dv = shapes.Dv;
    AttentionSteps s;
    s.out = Tensor(DType::f64, Shape{B, Hq, Lq, Dv});
    const detail::SdpaProblem p = detail::make_problem(q, k, v, options, s.out, nullptr, nullptr, kOp);
    s.scores = Tensor(DType::f64, Shape{B, Hq, Lq, Lk});
    s.softcapped_scores = Tensor(DType::f64, Shape{B, Hq, Lq, Lk});
    s.masked_scores = Tensor(DType::f64, Shape{B, Hq, Lq, Lk});
    s.weights = Tensor(DType::f64, Shape{B, Hq, Lq, Lk});
    s.lse = Tensor(DType::f64, Shape{B, Hq, Lq});
    const detail::Interrupt stop;  // the caller's flag (attn/interrupt.hpp), read once per query row
    for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t h = 0; h < Hq; ++h) {
            detail::HeadSteps hs;
            detail::reference_head(p, b, h, hs, stop);
            const std::int64_t head = b * Hq + h;
            std::copy(hs.scores.begin(), hs.scores.end(), s.scores.data_as<double>() + head * Lq * Lk);
            std::copy(hs.softcapped_scores.begin(), hs.softcapped_scores.end(),
                      s.softcapped_scores.data_as<double>() + head * Lq * Lk);
            std::copy(hs.masked_scores.begin(), hs.masked_scores.end(), s.masked_scores.data_as<double>() + head * Lq * Lk);
            std::copy(hs.weights.begin(), hs.weights.end(), s.weights.data_as<double>() + head * Lq * Lk);
            std::copy(hs.lse.begin(), hs.lse.end(), s.lse.data_as<double>() + head * Lq);
            std::copy(hs.out.begin(), hs.out.end(), s.out.data_as<double>() + head * Lq * Dv);
        }
    }
    return s;
}

}  // namespace attn
