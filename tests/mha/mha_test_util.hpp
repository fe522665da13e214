// Random inputs and parameters for the MHA layer's tests (forward, backward, incremental).
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/mha.hpp"
#include "common/util.hpp"

namespace attn::mha_test {

// Contiguous float32, normal(0, scale), drawn in float (the stream these tests were written with).
inline Tensor random_tensor(const Shape& s, std::mt19937& rng, double scale = 1.0) {
    return test::randn<float>(DType::f32, s, rng, scale);
}

// Every parameter normal(0, 1/√fan_in), loaded through the layer's own state_dict path.
inline void randomise(MultiHeadAttention& m, std::mt19937& rng) {
    std::vector<Tensor> keep;
    std::vector<std::pair<std::string, TensorView>> sd;
    for (const auto& [name, shape] : m.parameter_shapes()) {
        keep.push_back(random_tensor(shape, rng, 1.0 / std::sqrt(static_cast<double>(shape[shape.rank - 1]))));
        sd.emplace_back(name, keep.back().view());
    }
    m.load_state_dict(sd);
}

// The message of the attn::Error f throws ("no error" when it throws none).
inline std::string message(const std::function<void()>& f) {
    try {
        f();
    } catch (const attn::Error& e) {
        return e.what();
    }
    return "no error";
}

}  // namespace attn::mha_test
