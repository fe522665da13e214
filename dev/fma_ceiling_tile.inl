// One ISA's copy of fma_ceiling_lab's loops (included by fma_ceiling_avx2.cpp / _avx512.cpp, each
// compiled with its row's flags; FMA_CEILING_NS, Vec and the three vector helpers come from there).
//
// Every form runs the GEMM micro-kernel's shape — kMR rows × kNV vectors of accumulators, one FMA
// each per k — and differs only in where the operands come from, so the forms' ratio is what the
// loads alone cost the FMA ports.
#include <time.h>

#include <cstdint>

#include "fma_ceiling.hpp"

namespace FMA_CEILING_NS {
namespace {

double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One pass of kc steps over packed A (kMR floats per k) and packed B (kNV vectors per k).
// kLoadB: B's vectors loaded each k (else the pass's first ones, held in registers);
// kLoadA: A's scalars broadcast from memory each k (else one value held in a register).
template <bool kLoadB, bool kLoadA>
__attribute__((noinline)) float passes(std::int64_t reps, int kc, const float* a0, const float* b0) {
    Vec acc[kMR][kNV];
    for (auto& row : acc)
        for (auto& v : row) v = vzero();
    Vec b_fixed[kNV];
    for (int v = 0; v < kNV; ++v) b_fixed[v] = vload(b0 + kLanes * v);
    Vec a_fixed = vbroadcast(a0);
    for (std::int64_t rep = 0; rep < reps; ++rep) {
        const float* a = a0;
        const float* b = b0;
        for (int k = 0; k < kc; ++k, a += kMR, b += kLanes * kNV) {
            Vec bv[kNV];
            for (int v = 0; v < kNV; ++v) bv[v] = kLoadB ? vload(b + kLanes * v) : b_fixed[v];
            for (int r = 0; r < kMR; ++r) {
                const Vec av = kLoadA ? vbroadcast(a + r) : a_fixed;
                for (int v = 0; v < kNV; ++v) acc[r][v] = vfmadd(av, bv[v], acc[r][v]);
            }
        }
    }
    float s = 0.0f;
    for (auto& row : acc)
        for (auto& v : row) s += vsum(v);
    return s;
}

}  // namespace

// a: kc·kMR floats, b: kc·kLanes·kNV floats on 64 bytes (the caller's: no std container here,
// whose inline code compiled with this file's flags could be the one the linker keeps).
FormRates measure(int kc, double seconds, float* a, float* b) {
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(kc) * kMR; ++i) a[i] = 1e-3f * static_cast<float>(i % 5);
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(kc) * kLanes * kNV; ++i) b[i] = 1e-6f * static_cast<float>(i % 7);
    const double flop_per_pass = 2.0 * kLanes * kNV * kMR * kc;
    auto rate = [&](auto form) {
        std::int64_t reps = 1;
        for (;;) {  // double the passes until one timing lasts `seconds`
            const double t0 = thread_cpu_seconds();
            volatile float sink = form(reps);
            (void)sink;
            const double t = thread_cpu_seconds() - t0;
            if (t >= seconds) return flop_per_pass * static_cast<double>(reps) / t / 1e9;
            reps *= t > 0.01 ? static_cast<std::int64_t>(seconds / t) + 1 : 8;
        }
    };
    FormRates r;
    r.registers = rate([&](std::int64_t n) { return passes<false, false>(n, kc, a, b); });
    r.b_loads = rate([&](std::int64_t n) { return passes<true, false>(n, kc, a, b); });
    r.a_broadcasts = rate([&](std::int64_t n) { return passes<false, true>(n, kc, a, b); });
    r.kernel = rate([&](std::int64_t n) { return passes<true, true>(n, kc, a, b); });
    r.rows = kMR;
    r.columns = kLanes * kNV;
    return r;
}

}  // namespace FMA_CEILING_NS
