// What the labs of dev/ share: a clock reading and a reproducible random fill.
#pragma once

#include <time.h>

#include <cstdint>
#include <random>

#include "attn/tensor.hpp"

namespace lab {

// Seconds on clock c: CLOCK_MONOTONIC for wall time, CLOCK_PROCESS_CPUTIME_ID for the CPU time
// of every thread.
inline double now(clockid_t c = CLOCK_MONOTONIC) {
    timespec ts{};
    clock_gettime(c, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// t's float32 elements uniform in [-1, 1), a function of the seed: the same inputs on every run,
// so that runs of two builds compare.
inline void fill(const attn::Tensor& t, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    float* d = t.data_as<float>();
    const std::int64_t n = t.numel();
    for (std::int64_t i = 0; i < n; ++i) d[i] = u(rng);
}

}  // namespace lab
