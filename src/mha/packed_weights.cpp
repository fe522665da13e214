#include "packed_weights.hpp"

#include <memory>

#include "attn/mha.hpp"

namespace attn {

void MultiHeadAttention::pack_weights() { packed_ = packed_with({}); }

std::shared_ptr<const detail::PackedWeights> MultiHeadAttention::packed_with(
    const std::map<std::string, const Tensor*, std::less<>>& replace) const {
    auto packed = std::make_shared<detail::PackedWeights>();
    for (const auto& [name, param] : params_) {
        if (!is_weight_matrix(name)) continue;
        const auto it = replace.find(name);
        const Tensor& t = it != replace.end() ? *it->second : param;
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
    return packed;
}

}  // namespace attn
