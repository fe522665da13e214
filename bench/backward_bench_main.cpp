// attn_backward_bench [S1|S3 ...] [--runs N] [--no-torch] [--dropout P]: one line per shape.
// Threads: OMP_NUM_THREADS (bench-shapes.md uses 2).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backward_bench.hpp"

int main(int argc, char** argv) {
    int runs = 5;
    bool torch = true;
    double dropout = 0.0;
    std::vector<std::string> ids;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--no-torch")) torch = false;
        else if (!std::strcmp(argv[i], "--dropout") && i + 1 < argc) dropout = std::atof(argv[++i]);
        else ids.emplace_back(argv[i]);
    }
    std::printf("wall: medians of wall time; cpu: per CPU-second x threads (immune to other programs on the cores)\n");
    std::printf("%-4s %7s | %9s %8s %6s %8s %7s | %8s %8s %6s %8s %7s | %s\n", "id", "threads", "attn ms", "GFLOP/s",
                "%peak", "torch ms", "speedup", "cpu GF/s", "peak", "%peak", "torch", "speedup", "kernel");
    for (const auto& s : attn::bench::backward_shapes()) {
        bool want = ids.empty();
        for (const auto& id : ids) want |= id == s.id;
        if (!want) continue;
        const auto r = attn::bench::run_backward_bench(s, runs, torch ? "/usr/bin/python3" : "", ATTN_TORCH_SCRIPT,
                                                      dropout);
        std::printf("%-4s %7d | %9.1f %8.1f %5.0f%% %8.1f %6.1fx | %8.1f %8.1f %5.0f%% %8.2f %6.1fx | %s\n", s.id.c_str(),
                    r.threads, r.attn_seconds * 1e3, r.attn_gflops, 100.0 * r.attn_gflops / r.fma_peak_gflops,
                    r.torch_seconds * 1e3, r.torch_seconds > 0 ? r.torch_seconds / r.attn_seconds : 0.0,
                    r.attn_gflops_cpu, r.fma_peak_gflops_cpu, 100.0 * r.attn_gflops_cpu / r.fma_peak_gflops_cpu,
                    r.torch_cpu_seconds, r.torch_cpu_seconds > 0 ? r.torch_cpu_seconds / r.attn_cpu_seconds : 0.0,
                    r.kernel.c_str());
        std::fflush(stdout);
    }
}
