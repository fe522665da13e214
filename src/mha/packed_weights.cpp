#include "packed_weights.hpp"

#include <memory>

#include "attn/mha.hpp"

namespace attn {

void MultiHeadAttention::pack_weights() {
    auto packed = std::make_shared<detail::PackedWeights>();
    for (const auto& [name, t] : params_) {
        if (!is_weight_matrix(name)) continue;
        // linear(): y = x · Wᵀ, so op(B) = Wᵀ (K = cols, N = rows), read from W's storage dtype.
        detail::GemmArgs g;
        g.tb = true;
        g.N = t.shape()[0];
        g.K = t.shape()[1];
        g.ldb = g.K;
        if (t.dtype() == DType::f32) {
            g.B = t.data_as<const float>();
        } else {
            g.b16 = t.dtype() == DType::f16 ? detail::GemmHalf::f16 : detail::GemmHalf::bf16;
            g.B16 = static_cast<const std::uint16_t*>(t.data());
        }
        packed->matrices.emplace_back(name, detail::pack_b(g));
    }
    packed_ = std::move(packed);
}

void MultiHeadAttention::repack_if_packed() {
    if (packed_ == nullptr) return;
    packed_.reset();
    pack_weights();
}

}  // namespace attn
