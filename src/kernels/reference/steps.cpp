#include <algorithm>
#include <utility>

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
    // One head's buffers, reserved by the first head and refilled by each: a HeadSteps per head
    // faulted in four fresh Lq x Lk doubles again for every head (2 GiB at 8192 queries and keys).
    detail::HeadSteps hs;
    for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t h = 0; h < Hq; ++h) {
            detail::reference_head(p, b, h, hs, stop);
            // The head's rows, the flag read before each as in the steps (reference.cpp): the four
            // Lq x Lk copies are the first touch of fresh tensors, 2 GiB at 8192 queries and keys.
            const std::int64_t head = b * Hq + h;
            for (std::int64_t i = 0; i < Lq; ++i) {
                stop.stop_if_requested();
                const std::size_t from = static_cast<std::size_t>(i * Lk);
                const std::int64_t to = (head * Lq + i) * Lk;
                for (auto [src, dst] : {std::pair{&hs.scores, &s.scores}, std::pair{&hs.softcapped_scores, &s.softcapped_scores},
                                        std::pair{&hs.masked_scores, &s.masked_scores}, std::pair{&hs.weights, &s.weights}})
                    std::copy_n(src->data() + from, Lk, dst->data_as<double>() + to);
                s.lse.data_as<double>()[head * Lq + i] = hs.lse[static_cast<std::size_t>(i)];
                std::copy_n(hs.out.begin() + static_cast<std::size_t>(i * Dv), Dv, s.out.data_as<double>() + (head * Lq + i) * Dv);
            }
        }
    }
    return s;
}

}  // namespace attn
