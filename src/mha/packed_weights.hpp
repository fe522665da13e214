// The MHA layer's pre-packed weight matrices (MultiHeadAttention::pack_weights): each weight
// matrix W (rows, cols) as the projection GEMM's packed op(B) = Wᵀ (gemm.hpp PackedB), made by
// the GEMM's own packing routine, so a projection on it is bit-identical to the unpacked one.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../gemm/gemm.hpp"

namespace attn::detail {

struct PackedWeights {
    std::vector<std::pair<std::string, PackedB>> matrices;  // by parameter name
    // The packed matrix `name`, or null (not packed).
    const PackedB* find(std::string_view name) const {
        for (const auto& [n, p] : matrices)
            if (n == name) return &p;
        return nullptr;
    }
};

}  // namespace attn::detail
