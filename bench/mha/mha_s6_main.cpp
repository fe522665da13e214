// attn_mha_s6 [--runs N] [--parts all|forward|projections] [--impl auto|reference|flash] [--clock wall|cpu]
// Times S6 (see mha_s6.hpp) and prints one JSON object: per part the median seconds of N
// calls after one warm-up, and GFLOP/s by the written FLOP formulas.
// --clock cpu measures the process's CPU time instead of wall time: on a machine shared
// with other jobs, a 1-thread run (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1) timed this
// way is not inflated by waiting for a core (a multi-thread one still is, by spin-waits).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "mha_s6.hpp"

namespace {

bool g_cpu_clock = false;

double now_seconds() {
    if (g_cpu_clock) {
        timespec ts{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_seconds(int runs, const std::function<void()>& fn) {
    fn();  // warm-up
    std::vector<double> t;
    for (int r = 0; r < runs; ++r) {
        const double t0 = now_seconds();
        fn();
        t.push_back(now_seconds() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    int runs = 5;
    std::string parts = "all";
    attn::bench::MhaS6Shape shape;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            if (a == "--runs" && i + 1 < argc) runs = std::max(1, std::stoi(argv[++i]));
            else if (a == "--parts" && i + 1 < argc) parts = argv[++i];
            else if (a == "--impl" && i + 1 < argc) shape.impl = attn::parse_impl(argv[++i]);
            else if (a == "--clock" && i + 1 < argc) {
                const std::string c = argv[++i];
                if (c != "wall" && c != "cpu") throw attn::Error("--clock: expected wall or cpu but got '" + c + "'");
                g_cpu_clock = c == "cpu";
            } else {
                throw attn::Error("unknown argument '" + a + "' (expected --runs N, --parts all|forward|projections, --impl NAME, --clock wall|cpu)");
            }
        }
        if (parts != "all" && parts != "forward" && parts != "projections") {
            throw attn::Error("--parts: expected all, forward or projections but got '" + parts + "'");
        }
        attn::bench::MhaS6 s6(shape);
        std::string json = "{\"shape\": \"S6 B=4 L=512 E=768 h=12\", \"runs\": " + std::to_string(runs) +
                           ", \"clock\": \"" + (g_cpu_clock ? "cpu" : "wall") + "\"";
        auto part = [&](const char* name, double flop, const std::function<void()>& fn) {
            const double t = median_seconds(runs, fn);
            char buf[200];
            std::snprintf(buf, sizeof buf, ", \"%s\": {\"median_s\": %.6f, \"gflops\": %.2f}", name, t, flop / t * 1e-9);
            json += buf;
        };
        if (parts != "projections") part("forward", s6.flop_forward(), [&] { s6.forward(); });
        if (parts != "forward") {
            part("qkv_gemm", s6.flop_qkv(), [&] { s6.qkv_projection(); });
            part("out_gemm", s6.flop_out(), [&] { s6.out_projection(); });
            part("square_gemm", s6.flop_square(), [&] { s6.square_gemm(); });
        }
        if (parts == "all") part("attention", s6.flop_attention(), [&] { s6.attention(); });
        json += ", \"square_n\": " + std::to_string(s6.square_n());
        json += ", \"attention_kernel\": \"" + s6.attention_kernel() + "\"";
        char buf[200];
        std::snprintf(buf, sizeof buf, ", \"flop\": {\"forward\": %.4g, \"qkv\": %.4g, \"attention\": %.4g, \"out\": %.4g}}",
                      s6.flop_forward(), s6.flop_qkv(), s6.flop_attention(), s6.flop_out());
        json += buf;
        std::printf("%s\n", json.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "attn_mha_s6: error: %s\n", e.what());
        return 2;
    }
    return 0;
}
