// Helpers for the decode tests: the shared ones (random tensors, to_storage, unit_roundoff,
// poison, compare) plus the name these tests draw float32 inputs with.
#pragma once

#include <random>
#include <string>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "common/util.hpp"

namespace attn::test {

// Contiguous float32, normal(0, sd), drawn in float (the stream the decode bounds were measured with).
inline Tensor random_f32(const Shape& s, std::mt19937& rng, float sd = 1.0f) { return randn<float>(DType::f32, s, rng, sd); }

// The message of the attn::Error f throws; "(no error)" when it returns.
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// Options of a generation step: causal, bottom-right per sequence (the cache's new tokens last).
inline SdpaOptions causal_bottom_right() {
    SdpaOptions o;
    o.causal = Causal::bottom_right;
    return o;
}

}  // namespace attn::test
