// Backward benchmark: attn::sdpa_backward vs torch autograd of the hand-written attention,
// with the machine's FMA peak measured in the same run. FLOPs are counted from the
// formula of bench-shapes.md (backward = 2.5 × forward, forward = 4·B·H·Lq·Lk·D, causal
// half), not from what the kernel executes (it recomputes S, as FlashAttention-2 does).
#include "backward_bench.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <stdexcept>

#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"

namespace attn::bench {

float fma_chains_avx2(long n);  // fma_peak_avx2.cpp

namespace {

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of the whole process (all threads). On a shared, oversubscribed machine
// wall time also counts the time other programs held the cores; CPU time does not, so
// rates per CPU-second × threads estimate what a quiet machine would show.
double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

void fill_randn(Tensor& t, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = n(rng);
}

}  // namespace

std::vector<BackwardShape> backward_shapes() {
    return {{"S1", 1, 16, 16, 1024, 1024, 64, false}, {"S3", 1, 16, 16, 4096, 4096, 128, true}};
}

double measure_fma_peak_gflops(double* per_cpu_second) {
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0.0;
    const long n = 20'000'000;
    const int threads = omp_get_max_threads();
    std::vector<double> rates, cpu_rates;
    for (int rep = 0; rep < 5; ++rep) {
        float sum = 0;
        const double t0 = now(), c0 = cpu_now();
#pragma omp parallel reduction(+ : sum)
        sum += fma_chains_avx2(n);
        const double dt = now() - t0, dc = cpu_now() - c0;
        volatile float sink = sum;  // keeps the chains alive
        (void)sink;
        const double flops = static_cast<double>(n) * 12 * 8 * 2 * threads;
        rates.push_back(flops / dt / 1e9);
        cpu_rates.push_back(flops / (dc / threads) / 1e9);
    }
    if (per_cpu_second) *per_cpu_second = median(cpu_rates);
    return *std::max_element(rates.begin(), rates.end());  // peak: the least disturbed run
}

BackwardResult run_backward_bench(const BackwardShape& s, int runs, const std::string& python,
                                  const std::string& torch_script, double dropout_p) {
    BackwardResult r;
    r.shape = s;
    r.threads = omp_get_max_threads();
    const double fwd = 4.0 * static_cast<double>(s.B * s.Hq * s.Lq * s.Lk * s.D) * (s.causal ? 0.5 : 1.0);
    r.flops = 2.5 * fwd;

    Tensor q(DType::f32, Shape{s.B, s.Hq, s.Lq, s.D}), k(DType::f32, Shape{s.B, s.Hkv, s.Lk, s.D});
    Tensor v(DType::f32, Shape{s.B, s.Hkv, s.Lk, s.D}), dO(DType::f32, Shape{s.B, s.Hq, s.Lq, s.D});
    fill_randn(q, 1);
    fill_randn(k, 2);
    fill_randn(v, 3);
    fill_randn(dO, 4);
    Tensor out(DType::f32, Shape{s.B, s.Hq, s.Lq, s.D}), lse(DType::f32, Shape{s.B, s.Hq, s.Lq});
    SdpaOptions opt;
    opt.causal = s.causal ? Causal::top_left : Causal::none;
    opt.dropout_p = dropout_p;
    opt.dropout_seed = 1;
    TensorView lv = lse.view();
    sdpa(q, k, v, opt, out, &lv);  // auto: the fastest forward in this build

    Tensor dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv(DType::f32, v.shape());
    SdpaReport rep;
    std::vector<double> times, cpu_times;
    for (int i = 0; i <= runs; ++i) {
        const double t0 = now(), c0 = cpu_now();
        sdpa_backward(q, k, v, out, lse, dO, opt, dq, dk, dv, &rep);
        if (i > 0) {  // run 0 warms up (page faults, caches)
            times.push_back(now() - t0);
            cpu_times.push_back(cpu_now() - c0);
        }
    }
    r.kernel = rep.kernel;
    r.attn_seconds = median(times);
    r.attn_cpu_seconds = median(cpu_times);
    r.attn_gflops = r.flops / r.attn_seconds / 1e9;
    r.attn_gflops_cpu = r.flops / (r.attn_cpu_seconds / r.threads) / 1e9;
    r.fma_peak_gflops = measure_fma_peak_gflops(&r.fma_peak_gflops_cpu);

    if (!python.empty() && dropout_p == 0.0) {
        char cmd[1024];
        std::snprintf(cmd, sizeof cmd, "%s %s --B %ld --H %ld --L %ld --D %ld %s --threads %d --runs %d", python.c_str(),
                      torch_script.c_str(), static_cast<long>(s.B), static_cast<long>(s.Hq), static_cast<long>(s.Lq),
                      static_cast<long>(s.D), s.causal ? "--causal" : "", r.threads, runs);
        if (FILE* f = popen(cmd, "r")) {
            double secs = 0, cpu = 0;
            if (std::fscanf(f, "%lf %lf", &secs, &cpu) == 2 && secs > 0) {
                r.torch_seconds = secs;
                r.torch_cpu_seconds = cpu;
                r.torch_gflops = r.flops / secs / 1e9;
            }
            pclose(f);
        }
    }
    return r;
}

}  // namespace attn::bench
