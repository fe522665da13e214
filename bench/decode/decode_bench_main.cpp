// attn-decode-bench [runs] [--warm]: S5/S7 decode steps with f32 and f16 caches, and the
// read bandwidth of the machine, in one run. Threads: OMP_NUM_THREADS (default: all cores).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "decode_bench.hpp"

int main(int argc, char** argv) {
    int runs = 15;
    bool cold = true;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--warm") == 0) cold = false;
        else runs = std::atoi(argv[i]);
    }
    if (runs < 1) {
        std::fprintf(stderr, "attn-decode-bench: runs must be >= 1\n");
        return 2;
    }
    const attn::bench::DecodeBenchReport rep = attn::bench::run_decode_bench(runs, cold);
    std::fputs(rep.text().c_str(), stdout);
    return 0;
}
